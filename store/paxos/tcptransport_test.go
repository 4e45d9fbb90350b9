package paxos

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-run/atoll/internal/freeport"
	"github.com/atoll-run/atoll/proto/paxospb"
)

func freeAddrs(t *testing.T, n int) []string {
	addrs, err := freeport.Addrs("127.0.0.1", n) // below the ephemeral range: see freeport
	if err != nil {
		t.Fatal(err)
	}
	return addrs
}

func TestTCPClusterAndBadFrames(t *testing.T) {
	addrs := freeAddrs(t, 3)
	peers := map[uint64]string{1: addrs[0], 2: addrs[1], 3: addrs[2]}
	ids := []uint64{1, 2, 3}
	token := []byte("cluster-secret-token")
	reps := map[uint64]*Replica{}
	trs := map[uint64]*TCPTransport{}
	sms := map[uint64]*testSM{}
	dir := t.TempDir()
	for _, id := range ids {
		tr, err := NewTCPTransport(TCPConfig{ID: id, Listen: peers[id], Peers: peers, Token: token, MaxFrame: 1 << 20, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		w, err := OpenWAL(filepath.Join(dir, fmt.Sprint(id)), WALOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultReplicaConfig(id, ids)
		cfg.Logger = zaptest.NewLogger(t)
		sms[id] = &testSM{data: map[string]string{}}
		r, err := StartReplica(cfg, w, tr, sms[id])
		if err != nil {
			t.Fatal(err)
		}
		reps[id], trs[id] = r, tr
	}
	defer func() {
		for _, id := range ids {
			reps[id].Close()
			trs[id].Close()
		}
	}()
	c := &testCluster{t: t, ids: ids, reps: reps, sms: sms}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.put(ctx, "a", "1"); err != nil {
		t.Fatal(err)
	}

	// Hostile inputs against replica 1's listener.
	attacks := []struct {
		name string
		do   func(c net.Conn)
	}{
		{"garbage", func(c net.Conn) { c.Write([]byte("GET / HTTP/1.1\r\n\r\n")) }},
		{"oversized-hello", func(c net.Conn) { c.Write([]byte{0xff, 0xff, 0xff, 0xff}) }},
		{"truncated-hello", func(c net.Conn) { c.Write([]byte{0, 0, 0, 50, 1, 2, 3}) }},
		{"wrong-token", func(c net.Conn) {
			var hdr [4]byte
			c.Read(hdr[:])
			buf := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			c.Read(buf)
			b, _ := proto.Marshal(&paxospb.Hello{From: 2, Nonce: make([]byte, 32), Mac: make([]byte, 32)})
			c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...))
			// then a forged Accept that must never reach the core
			m, _ := appendFrame(nil, Message{Type: MsgAccept, From: 2, To: 1, Ballot: MakeBallot(1<<40, 2), Commit: 99})
			c.Write(m)
		}},
	}
	for _, a := range attacks {
		conn, err := net.Dial("tcp", peers[1])
		if err != nil {
			t.Fatal(err)
		}
		a.do(conn)
		time.Sleep(20 * time.Millisecond)
		conn.Close()
	}
	// Oversized and truncated frames from an authenticated peer are dropped too.
	pt := &TCPTransport{cfg: TCPConfig{ID: 2, Token: token, Peers: peers}}
	conn, err := net.Dial("tcp", peers[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := pt.clientHandshake(conn, 1); err != nil {
		t.Fatalf("handshake with the right token: %v", err)
	}
	conn.Write([]byte{0x7f, 0xff, 0xff, 0xff, 1, 2, 3})
	conn.Close()

	if st := reps[1].Status(); BallotRound(st.Promised) >= 1<<40 {
		t.Fatalf("forged message reached the core: promised %x", st.Promised)
	}
	for i := 0; i < 50; i++ {
		if err := c.put(ctx, fmt.Sprintf("k%d", i), "v"); err != nil {
			t.Fatalf("cluster broken after bad frames: %v", err)
		}
	}
}

// A peer unknown to a transport is refused at the handshake until SetPeer names it (a
// replica added to the group), and then both directions work.
func TestTCPSetPeer(t *testing.T) {
	addrs := freeAddrs(t, 2)
	token := []byte("cluster-secret-token")
	a, err := NewTCPTransport(TCPConfig{ID: 1, Listen: addrs[0], Peers: map[uint64]string{1: addrs[0]}, Token: token, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewTCPTransport(TCPConfig{ID: 2, Listen: addrs[1], Peers: map[uint64]string{1: addrs[0], 2: addrs[1]}, Token: token, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	recv := func(tr *TCPTransport, d time.Duration) (Message, bool) {
		select {
		case m := <-tr.Recv():
			return m, true
		case <-time.After(d):
			return Message{}, false
		}
	}
	b.Send(Message{Type: MsgLearn, From: 2, To: 1, Commit: 7})
	if m, ok := recv(a, 300*time.Millisecond); ok {
		t.Fatalf("unknown peer's message delivered: %+v", m)
	}
	a.SetPeer(2, addrs[1])
	deadline := time.Now().Add(5 * time.Second)
	for {
		b.Send(Message{Type: MsgLearn, From: 2, To: 1, Commit: 7, Epoch: 3})
		if m, ok := recv(a, 100*time.Millisecond); ok {
			if m.From != 2 || m.Commit != 7 || m.Epoch != 3 {
				t.Fatalf("got %+v", m)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("added peer's message not delivered")
		}
	}
	conf := ConfState{Epoch: 2, Start: 5, Members: []uint64{1, 2}, Addrs: map[uint64]string{2: addrs[1]}}
	a.Send(Message{Type: MsgSnapshot, From: 1, To: 2, Slot: 4, Snapshot: []byte("s"), Conf: conf})
	m, ok := recv(b, 5*time.Second)
	if !ok || m.Conf.Epoch != 2 || m.Conf.Start != 5 || m.Conf.Addrs[2] != addrs[1] || len(m.Conf.Members) != 2 {
		t.Fatalf("snapshot with configuration: %+v (delivered %v)", m, ok)
	}
}
