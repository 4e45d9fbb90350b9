package paxos

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap/zaptest"
)

func lastSegment(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var last string
	for _, e := range ents {
		if len(e.Name()) == 20 && e.Name() > last {
			last = e.Name()
		}
	}
	if last == "" {
		t.Fatalf("no segment in %s", dir)
	}
	return filepath.Join(dir, last)
}

func TestWALCorruptTail(t *testing.T) {
	cases := []struct {
		name     string
		damage   func(t *testing.T, path string)
		wantErr  error
		wantLast uint64 // highest slot surviving
	}{
		{"clean", func(t *testing.T, path string) {}, nil, 5},
		{"torn-tail", func(t *testing.T, path string) {
			st, _ := os.Stat(path)
			if err := os.Truncate(path, st.Size()-3); err != nil {
				t.Fatal(err)
			}
		}, nil, 4},
		{"flipped-byte-in-tail", func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			b[len(b)-2] ^= 0xff
			os.WriteFile(path, b, 0o640)
		}, nil, 4},
		{"garbage-appended", func(t *testing.T, path string) {
			f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			f.Write([]byte{0xff, 0xff, 0xff, 0x7f, 1, 2})
			f.Close()
		}, nil, 5},
		{"corrupt-middle", func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			b[10] ^= 0xff
			os.WriteFile(path, b, 0o640)
		}, ErrCorruptWAL, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			w, err := OpenWAL(dir, WALOptions{Logger: zaptest.NewLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			for s := uint64(1); s <= 5; s++ {
				if err := w.Save(HardState{Promised: 7}, []Entry{{Slot: s, Ballot: 7, Data: []byte("value-of-some-length")}}); err != nil {
					t.Fatal(err)
				}
			}
			w.Close()
			tc.damage(t, lastSegment(t, dir))
			w, err = OpenWAL(dir, WALOptions{Logger: zaptest.NewLogger(t)})
			if err != nil {
				t.Fatalf("reopen: %v", err)
			}
			defer w.Close()
			hs, ents, err := w.Load()
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("load err %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			if hs.Promised != 7 || uint64(len(ents)) != tc.wantLast || ents[len(ents)-1].Slot != tc.wantLast {
				t.Fatalf("after repair: hs %+v, %d entries", hs, len(ents))
			}
			// The log keeps working after repair and the new record survives a reopen.
			if err := w.Save(HardState{Promised: 9}, []Entry{{Slot: tc.wantLast + 1, Ballot: 9}}); err != nil {
				t.Fatal(err)
			}
			w.Close()
			w, err = OpenWAL(dir, WALOptions{})
			if err != nil {
				t.Fatal(err)
			}
			hs, ents, err = w.Load()
			if err != nil || hs.Promised != 9 || ents[len(ents)-1].Slot != tc.wantLast+1 {
				t.Fatalf("after second reopen: %v %+v %d", err, hs, len(ents))
			}
		})
	}
}
