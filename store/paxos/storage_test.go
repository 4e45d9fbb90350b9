package paxos

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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

// walRecords is how many records TestWALCorruptTail writes (slots 1..walRecords), each
// with the same frame size.
const walRecords = 20

func TestWALCorruptTail(t *testing.T) {
	appendBytes := func(t *testing.T, path string, b []byte) {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	cases := []struct {
		name    string
		damage  func(t *testing.T, path string) (wantLast uint64) // highest slot surviving
		wantErr error
	}{
		{"clean", func(t *testing.T, path string) uint64 { return walRecords }, nil},
		{"torn-tail", func(t *testing.T, path string) uint64 {
			st, _ := os.Stat(path)
			if err := os.Truncate(path, st.Size()-3); err != nil {
				t.Fatal(err)
			}
			return walRecords - 1
		}, nil},
		{"flipped-byte-in-tail", func(t *testing.T, path string) uint64 {
			b, _ := os.ReadFile(path)
			b[len(b)-2] ^= 0xff
			os.WriteFile(path, b, 0o640)
			return walRecords - 1
		}, nil},
		{"garbage-appended", func(t *testing.T, path string) uint64 {
			appendBytes(t, path, []byte{0xff, 0xff, 0xff, 0x7f, 1, 2})
			return walRecords
		}, nil},
		// What a crash leaves on many file systems: the file was extended, its data never
		// written (issue 14, finding 4).
		{"two-zero-bytes-appended", func(t *testing.T, path string) uint64 {
			appendBytes(t, path, make([]byte, 2))
			return walRecords
		}, nil},
		{"4-KiB-of-zeros-appended", func(t *testing.T, path string) uint64 {
			appendBytes(t, path, make([]byte, 4096))
			return walRecords
		}, nil},
		{"last-300-bytes-zeroed", func(t *testing.T, path string) uint64 {
			b, _ := os.ReadFile(path)
			clear(b[len(b)-300:])
			os.WriteFile(path, b, 0o640)
			frame := len(b) / walRecords
			return uint64((len(b) - 300) / frame) // records wholly before the zeroed bytes
		}, nil},
		{"everything-zeroed", func(t *testing.T, path string) uint64 {
			b, _ := os.ReadFile(path)
			os.WriteFile(path, make([]byte, len(b)), 0o640)
			return 0
		}, nil},
		{"corrupt-middle", func(t *testing.T, path string) uint64 {
			b, _ := os.ReadFile(path)
			b[10] ^= 0xff
			os.WriteFile(path, b, 0o640)
			return 0
		}, ErrCorruptWAL},
		{"corrupt-middle-then-zeros", func(t *testing.T, path string) uint64 {
			b, _ := os.ReadFile(path)
			frame := len(b) / walRecords
			b[10*frame+8] ^= 0xff // inside record 11's body
			os.WriteFile(path, append(b, make([]byte, 64)...), 0o640)
			return 0
		}, ErrCorruptWAL},
		{"zeroed-middle-record", func(t *testing.T, path string) uint64 {
			b, _ := os.ReadFile(path)
			frame := len(b) / walRecords
			clear(b[5*frame+1 : 6*frame]) // record 6's body, its length kept
			os.WriteFile(path, b, 0o640)
			return 0
		}, ErrCorruptWAL},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			w, err := OpenWAL(dir, WALOptions{Logger: zaptest.NewLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			for s := uint64(1); s <= walRecords; s++ {
				if err := w.Save(HardState{Promised: 7}, []Entry{{Slot: s, Ballot: 7, Data: []byte("value-of-some-length")}}); err != nil {
					t.Fatal(err)
				}
			}
			w.Close()
			wantLast := tc.damage(t, lastSegment(t, dir))
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
			if uint64(len(ents)) != wantLast || (wantLast > 0 && (hs.Promised != 7 || ents[len(ents)-1].Slot != wantLast)) {
				t.Fatalf("after repair: hs %+v, %d entries, want %d", hs, len(ents), wantLast)
			}
			// The log keeps working after repair and the new record survives a reopen.
			if err := w.Save(HardState{Promised: 9}, []Entry{{Slot: wantLast + 1, Ballot: 9}}); err != nil {
				t.Fatal(err)
			}
			w.Close()
			w, err = OpenWAL(dir, WALOptions{})
			if err != nil {
				t.Fatal(err)
			}
			hs, ents, err = w.Load()
			if err != nil || hs.Promised != 9 || ents[len(ents)-1].Slot != wantLast+1 {
				t.Fatalf("after second reopen: %v %+v %d", err, hs, len(ents))
			}
		})
	}
}

// A WAL whose only record is torn starts empty, and keeps its snapshot (only the segments
// are reset).
func TestWALResetKeepsSnapshot(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWAL(dir, WALOptions{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.SaveSnapshot(SnapshotData{Slot: 40, Data: []byte("state"), Conf: ConfState{Epoch: 1, Members: []uint64{1, 2, 3}}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Save(HardState{Promised: 7, Commit: 41}, []Entry{{Slot: 41, Ballot: 7, Data: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	b, _ := os.ReadFile(lastSegment(t, dir))
	b[len(b)-1] ^= 0xff
	os.WriteFile(lastSegment(t, dir), b, 0o640)
	for reopen := 0; reopen < 2; reopen++ {
		w, err = OpenWAL(dir, WALOptions{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		hs, ents, err := w.Load()
		w.Close()
		if err != nil || len(ents) != 0 || hs.Snapshot != 40 {
			t.Fatalf("reopen %d: hs %+v, %d entries, %v; want the snapshot through 40 and no entry", reopen, hs, len(ents), err)
		}
	}
}

// Two openers of one directory: the second is refused with ErrLocked naming the directory
// and the holder's pid (issue 14, finding 3); closing releases the lock.
func TestWALDirectoryLock(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenWAL(dir, WALOptions{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = OpenWAL(dir, WALOptions{NoSync: true})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), fmt.Sprintf("process %d", os.Getpid())) {
		t.Fatalf("second open in this process: %v, want ErrLocked naming %s and pid %d", err, dir, os.Getpid())
	}
	w.Close()
	w, err = OpenWAL(dir, WALOptions{NoSync: true})
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	w.Close()

	// Another process holds it: this test binary, re-run as the holder.
	cmd := exec.Command(os.Args[0], "-test.run=^TestWALLockHolder$")
	cmd.Env = append(os.Environ(), "ATOLL_WAL_LOCK_DIR="+dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "locked" {
		t.Fatalf("holder said %q: %v", line, err)
	}
	_, err = OpenWAL(dir, WALOptions{NoSync: true})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), fmt.Sprintf("process %d", cmd.Process.Pid)) {
		t.Fatalf("open while process %d holds it: %v", cmd.Process.Pid, err)
	}
}

// TestWALLockHolder is the holder process of TestWALDirectoryLock: it opens the WAL in
// $ATOLL_WAL_LOCK_DIR, says "locked", and holds it until its stdin closes.
func TestWALLockHolder(t *testing.T) {
	dir := os.Getenv("ATOLL_WAL_LOCK_DIR")
	if dir == "" {
		t.Skip("the holder process of TestWALDirectoryLock")
	}
	w, err := OpenWAL(dir, WALOptions{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	fmt.Println("locked")
	io.Copy(io.Discard, os.Stdin)
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
