package api

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadWorkerSpec(t *testing.T) {
	spec := WorkerSpec{Job: "j", Gang: "g", Rank: 1, Generation: 2, Token: "secret", Heads: []string{"http://h:1"}}
	good, _ := json.Marshal(spec)
	cases := []struct {
		name    string
		mode    os.FileMode
		content []byte
		missing bool
		err     string // "" for a spec read back
	}{
		{name: "owner only", mode: 0o600, content: good},
		{name: "owner only, executable too", mode: 0o700, content: good},
		{name: "read-only for its owner", mode: 0o400, content: good},
		{name: "group-readable", mode: 0o640, content: good, err: "must be readable by its owner only (0600)"},
		{name: "world-readable", mode: 0o604, content: good, err: "has mode -rw----r--"},
		{name: "group-writable", mode: 0o620, content: good, err: "(0600)"},
		{name: "missing", missing: true, err: "no such file"},
		{name: "not JSON", mode: 0o600, content: []byte("{"), err: "unexpected end of JSON input"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "spec.json")
			if !c.missing {
				if err := os.WriteFile(path, c.content, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(path, c.mode); err != nil { // past the umask
					t.Fatal(err)
				}
			}
			got, err := ReadWorkerSpec(path)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), path) {
					t.Fatalf("error %v, want one naming the file and saying %q", err, c.err)
				}
				if got.Token != "" {
					t.Error("a refused spec still gave its token")
				}
				return
			}
			if err != nil || got.Key() != "j/g/1.g2" || got.Token != "secret" {
				t.Fatalf("spec %+v, %v", got, err)
			}
		})
	}
	if _, err := ReadWorkerSpec(filepath.Join(t.TempDir(), "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing spec: %v, want os.ErrNotExist wrapped", err)
	}
}

func TestCheckName(t *testing.T) {
	cases := []struct {
		name string
		ok   bool
	}{
		{"a", true}, {"job-1.v2_x", true}, {"9", true}, {strings.Repeat("x", 63), true},
		{"", false}, {"-a", false}, {".a", false}, {"a/b", false}, {"../x", false}, {"a b", false}, {strings.Repeat("x", 64), false},
	}
	for _, c := range cases {
		err := CheckName("job", c.name)
		if (err == nil) != c.ok || err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("CheckName(%q) = %v", c.name, err)
		}
	}
}

func TestEventKeys(t *testing.T) {
	for _, seq := range []int64{1, 42, 1 << 40} {
		k := EventKey(seq)
		if len(k) != 20 {
			t.Errorf("key %q is not of fixed width (they sort by sequence)", k)
		}
		for _, key := range []string{k, TableEvents + k} {
			if got, err := EventSeq(key); err != nil || got != seq {
				t.Errorf("EventSeq(%q) = %d, %v", key, got, err)
			}
		}
	}
	for _, bad := range []string{"", "x", "0", "-3", TableEvents} {
		if _, err := EventSeq(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("EventSeq(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestDashboardToken(t *testing.T) {
	a, b := DashboardToken([]byte("secret")), DashboardToken([]byte("other"))
	if a == b || a != DashboardToken([]byte("secret")) || len(a) != 64 || strings.Contains(a, "secret") {
		t.Errorf("tokens %q %q: want a fixed 64-hex-digit derivation per secret", a, b)
	}
}
