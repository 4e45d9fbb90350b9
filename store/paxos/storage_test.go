package paxos

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
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

// A snapshot keeps its configuration across a reopen; a snapshot in the older format (no
// configuration) is still read.
func TestWALSnapshotCarriesConfiguration(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWAL(dir, WALOptions{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	conf := ConfState{Epoch: 3, Start: 41, Members: []uint64{1, 3, 4}, Addrs: map[uint64]string{4: "10.0.0.4:7000"}}
	if err := w.SaveSnapshot(SnapshotData{Slot: 40, Data: []byte("state"), Conf: conf}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	w, err = OpenWAL(dir, WALOptions{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	hs, _, err := w.Load()
	if err != nil {
		t.Fatal(err)
	}
	if hs.Snapshot != 40 || hs.Conf.Epoch != 3 || hs.Conf.Start != 41 || !slices.Equal(hs.Conf.Members, conf.Members) || hs.Conf.Addrs[4] != "10.0.0.4:7000" {
		t.Fatalf("loaded %+v", hs)
	}
	s, err := w.LoadSnapshot()
	if err != nil || string(s.Data) != "state" {
		t.Fatalf("snapshot %+v: %v", s, err)
	}
	// The older format: slot, CRC32-C of the data, data.
	old := t.TempDir()
	b := binary.BigEndian.AppendUint64(nil, 9)
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum([]byte("v1"), crcTable))
	if err := os.WriteFile(filepath.Join(old, snapshotFileV1), append(b, "v1"...), 0o600); err != nil {
		t.Fatal(err)
	}
	w1, err := OpenWAL(old, WALOptions{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w1.Close()
	s, err = w1.LoadSnapshot()
	if err != nil || s.Slot != 9 || string(s.Data) != "v1" || s.Conf.Epoch != 0 {
		t.Fatalf("v1 snapshot %+v: %v", s, err)
	}
}
