package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestParsePeers(t *testing.T) {
	cases := []struct {
		in      string
		want    int
		wantErr string
	}{
		{"1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003", 3, ""},
		{" 1=a:1 , 2=b:2 ,", 2, ""},
		{"1=a:1,1=b:2", 0, "listed twice"},
		{"x=a:1", 0, "entry 1"},
		{"1=a:1,2", 0, "entry 2"},
		{"0=a:1", 0, "entry 1"},
		{"70000=a:1", 0, "entry 1"},
		{"1=", 0, "entry 1"},
	}
	for _, tc := range cases {
		got, err := parsePeers(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parsePeers(%q) error %v, want it to mention %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || len(got) != tc.want {
			t.Errorf("parsePeers(%q) = %v, %v", tc.in, got, err)
		}
	}
}

func TestHeadRefusesWithoutTokenOrDir(t *testing.T) {
	t.Setenv("ATOLL_TOKEN", "")
	for _, args := range [][]string{
		{"head", "--id", "1", "--peers", "1=127.0.0.1:0", "--data-dir", t.TempDir()},
		{"head", "--id", "1", "--peers", "1=127.0.0.1:0", "--token", "secret-token-0123456789"}, // no such flag: secrets stay off the command line
		{"head", "--id", "1", "--peers", "1=", "--data-dir", t.TempDir()},
	} {
		root := newRootCmd()
		root.SetArgs(args)
		if err := root.Execute(); err == nil {
			t.Errorf("atoll %v: no error", args)
		}
	}
}

// A head that would serve beyond loopback needs the cluster CA (mutual TLS), or the explicit
// --insecure-no-tls; a CA directory that is not one is refused.
func TestHeadRefusesClearLinksBeyondLoopback(t *testing.T) {
	t.Setenv("ATOLL_TOKEN", "secret-token-0123456789")
	t.Setenv("ATOLL_CA_DIR", "")
	bad := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"head", "--id", "1", "--peers", "1=127.0.0.1:0", "--client-listen", "0.0.0.0:0", "--data-dir", t.TempDir()}, "--insecure-no-tls"},
		{[]string{"head", "--id", "1", "--peers", "1=0.0.0.0:0", "--data-dir", t.TempDir()}, "not a loopback address"},
		{[]string{"head", "--id", "1", "--peers", "1=127.0.0.1:0", "--gossip", "0.0.0.0:0", "--data-dir", t.TempDir()}, "--ca-dir"},
		{[]string{"head", "--id", "1", "--peers", "1=127.0.0.1:0", "--ca-dir", bad, "--data-dir", t.TempDir()}, "the cluster CA"},
		{[]string{"head", "--id", "1", "--peers", "1=127.0.0.1:0", "--ca-dir", bad, "--insecure-no-tls", "--data-dir", t.TempDir()}, "contradict"},
	} {
		root := newRootCmd()
		root.SetArgs(tc.args)
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		if err := root.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("atoll %v: %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
}

// The heads' Paxos timing is settable on atoll head and atoll up; a timing an election
// could not run on is refused before anything starts, naming the flag.
func TestTimingFlagsValidated(t *testing.T) {
	t.Setenv("ATOLL_TOKEN", "secret-token-0123456789")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"head", "--id", "1", "--peers", "1=127.0.0.1:0", "--data-dir", t.TempDir(), "--election-timeout", "300ms"}, "--election-timeout 300ms with --tick 100ms: want 5 ticks (500ms)"},
		{[]string{"head", "--id", "1", "--peers", "1=127.0.0.1:0", "--data-dir", t.TempDir(), "--tick", "0s"}, "--tick 0s: want 1ms..1s"},
		{[]string{"head", "--id", "1", "--peers", "1=127.0.0.1:0", "--data-dir", t.TempDir(), "--tick", "500ms"}, "--election-timeout 1s with --tick 500ms"},
		{[]string{"up", "--dir", t.TempDir(), "--election-timeout", "2m"}, "up: --election-timeout 2m0s"},
		{[]string{"up", "--dir", t.TempDir(), "--tick", "2s"}, "up: --tick 2s"},
	} {
		root := newRootCmd()
		root.SetArgs(tc.args)
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("atoll %v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
	if err := checkTiming(100*time.Millisecond, time.Second); err != nil {
		t.Errorf("the defaults are refused: %v", err)
	}
}

// TestOrdinalID: a StatefulSet pod's ordinal is its head id minus one; a host name
// without one is an error that names it.
func TestOrdinalID(t *testing.T) {
	for host, want := range map[string]uint64{"atoll-head-0": 1, "atoll-head-2": 3, "h-65534": 65535} {
		if got, err := ordinalID(host); err != nil || got != want {
			t.Errorf("ordinalID(%q) = %d, %v; want %d", host, got, err, want)
		}
	}
	for _, host := range []string{"atoll", "atoll-head-", "atoll-head-x", "h-65535", "h-+1"} {
		if _, err := ordinalID(host); err == nil || !strings.Contains(err.Error(), host) {
			t.Errorf("ordinalID(%q): %v; want an error naming it", host, err)
		}
	}
}
