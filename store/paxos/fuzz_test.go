package paxos

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/atoll-run/atoll/proto/paxospb"
)

// Fuzzers of every decoder of outside bytes in this package: WAL records and segments,
// snapshot files, transport frames (and the core stepping what they decode to), and the
// handshake hello. `go test` runs the seeds; run one for longer with e.g.
//
//	go test -run '^$' -fuzz '^FuzzWALSegment$' -fuzztime 60s ./store/paxos/

func seedRecords() [][]byte {
	var out [][]byte
	for _, ents := range [][]Entry{nil, {{Slot: 1, Ballot: MakeBallot(1, 1), Data: []byte("v")}},
		{{Slot: 2, Ballot: 7, Type: EntryConfig, Epoch: 1, Data: EncodeConfState(ConfState{Epoch: 2, Members: []uint64{1, 2}})}}} {
		body, _ := proto.Marshal(&paxospb.Record{Promised: 7, Commit: 1, Entries: toPBEntries(ents)})
		rec := binary.LittleEndian.AppendUint32(nil, crc32.Checksum(body, crcTable))
		out = append(out, append(rec, body...))
	}
	return out
}

func FuzzWALRecord(f *testing.F) {
	for _, r := range seedRecords() {
		f.Add(r)
		f.Add(r[:len(r)-1])
	}
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := decodeRecord(data)
		if err != nil {
			return
		}
		// What decodes re-encodes to a record that decodes to the same.
		body, merr := proto.Marshal(rec)
		if merr != nil {
			t.Fatal(merr)
		}
		again, err := decodeRecord(append(binary.LittleEndian.AppendUint32(nil, crc32.Checksum(body, crcTable)), body...))
		if err != nil || !proto.Equal(rec, again) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

// FuzzWALSegment opens a WAL whose only segment holds the fuzzed bytes: OpenWAL and Load
// either fail with an error or load, and a loaded WAL takes a new record that survives a
// reopen.
func FuzzWALSegment(f *testing.F) {
	var seg []byte
	for _, r := range seedRecords() {
		seg = binary.AppendUvarint(seg, uint64(len(r)))
		seg = append(seg, r...)
	}
	f.Add(seg)
	f.Add(append(bytes.Clone(seg), 0, 0))
	f.Add(seg[:len(seg)-3])
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "00000000000000000001"), data, 0o640); err != nil {
			t.Fatal(err)
		}
		w, err := OpenWAL(dir, WALOptions{NoSync: true})
		if err != nil {
			return
		}
		defer w.Close()
		hs, ents, err := w.Load()
		if err != nil {
			if !errors.Is(err, ErrCorruptWAL) {
				t.Fatalf("load error %v is not ErrCorruptWAL", err)
			}
			return
		}
		var top uint64
		for _, e := range ents {
			top = max(top, e.Slot)
		}
		if err := w.Save(HardState{Promised: hs.Promised, Commit: hs.Commit}, []Entry{{Slot: top + 1, Ballot: 1, Data: []byte("after")}}); err != nil {
			t.Fatal(err)
		}
		w.Close()
		w, err = OpenWAL(dir, WALOptions{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		_, ents, err = w.Load()
		if err != nil || len(ents) == 0 || string(ents[len(ents)-1].Data) != "after" {
			t.Fatalf("after a save and reopen: %v, %d entries", err, len(ents))
		}
	})
}

// FuzzSnapshotFile: LoadSnapshot of any file content fails with ErrCorruptWAL or loads.
func FuzzSnapshotFile(f *testing.F) {
	dir := f.TempDir()
	w, err := OpenWAL(dir, WALOptions{NoSync: true})
	if err != nil {
		f.Fatal(err)
	}
	if err := w.SaveSnapshot(SnapshotData{Slot: 40, Data: []byte("state"), Conf: ConfState{Epoch: 2, Start: 41, Members: []uint64{1, 2, 3}, Addrs: map[uint64]string{3: "h:1"}}}); err != nil {
		f.Fatal(err)
	}
	w.Close()
	good, err := os.ReadFile(filepath.Join(dir, snapshotFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:13])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, snapshotFile), data, 0o640); err != nil {
			t.Fatal(err)
		}
		w := &WAL{dir: dir}
		s, err := w.LoadSnapshot()
		if err != nil && !errors.Is(err, ErrCorruptWAL) {
			t.Fatalf("error %v is not ErrCorruptWAL", err)
		}
		if err == nil && len(data) < 16 {
			t.Fatalf("loaded %+v from %d bytes", s, len(data))
		}
	})
}

// fuzzNodes returns a leader (1) and a follower (2) of a three-replica group, and a
// joining replica (4), each having handed out its Readies.
func fuzzNodes(t *testing.T) []*Node {
	h := newHarness(t, 3, nil)
	h.elect(1)
	if _, _, err := h.nodes[1].Propose([]byte("x")); err != nil {
		t.Fatal(err)
	}
	h.settle()
	cfg := DefaultConfig(4, nil)
	cfg.Join = true
	j, err := NewNode(cfg, HardState{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return []*Node{h.nodes[1], h.nodes[2], j}
}

// FuzzFrame reads transport frames as TCPTransport's receive loop does and steps every
// decoded message into a leader, a follower and a joining replica: nothing panics, and
// the nodes keep producing valid output.
func FuzzFrame(f *testing.F) {
	for _, m := range []Message{
		{Type: MsgAccept, From: 2, To: 1, Ballot: MakeBallot(9, 2), Commit: 3, Seq: 4, Epoch: 1, Entries: []Entry{{Slot: 3, Data: []byte("v")}}},
		{Type: MsgAccepted, From: 2, To: 1, Ballot: MakeBallot(1, 1), Slot: 1, Last: 9, Commit: 1, KnownCommit: 5, Epoch: 1},
		{Type: MsgPrepare, From: 3, To: 2, Ballot: MakeBallot(5, 3), Slot: 1, Epoch: 1},
		{Type: MsgPromise, From: 2, To: 1, Ballot: MakeBallot(1, 1), Last: 4, Epoch: 1, Entries: []Entry{{Slot: 2, Ballot: 3}}},
		{Type: MsgChosen, From: 1, To: 4, Commit: 3, Entries: []Entry{{Slot: 1, Type: EntryConfig, Data: []byte{0xff}}}},
		{Type: MsgSnapshot, From: 1, To: 2, Slot: 9, Commit: 9, Snapshot: []byte("s"), Conf: ConfState{Epoch: 7, Members: []uint64{1, 2}}},
		{Type: MsgLearn, From: 3, To: 1, Commit: 0, Epoch: 9},
	} {
		b, err := appendFrame(nil, m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0, 0, 0, 2, 8})
	f.Fuzz(func(t *testing.T, data []byte) {
		nodes := fuzzNodes(t)
		r := bufio.NewReader(bytes.NewReader(data))
		for {
			buf, err := readFrame(r, 1<<20, nil)
			if err != nil {
				return
			}
			pm := &paxospb.Message{}
			if proto.Unmarshal(buf, pm) != nil {
				continue
			}
			m := fromPBMessage(pm)
			for _, n := range nodes {
				m.To = n.ID()
				n.Step(m)
				for n.HasReady() {
					rd := n.Ready()
					n.Advance(rd)
				}
				n.Tick()
			}
		}
	})
}

// FuzzHello: the handshake's hello decoder refuses or decodes any bytes.
func FuzzHello(f *testing.F) {
	b, _ := proto.Marshal(&paxospb.Hello{From: 2, Nonce: make([]byte, 32), Mac: make([]byte, 32)})
	f.Add(append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		readHello(bytes.NewReader(data))
	})
}
