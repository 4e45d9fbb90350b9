package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestPortsBelowTheEphemeralRange: the ports come from Range, distinct while held, and
// one of them can be bound again once closed.
func TestPortsBelowTheEphemeralRange(t *testing.T) {
	seen := map[int]bool{}
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			ln.Close()
		}
	}()
	for range 20 {
		ln, err := Listen("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, ln)
		p := ln.Addr().(*net.TCPAddr).Port
		if p < Low || p >= Low+Span {
			t.Fatalf("port %d: want one in [%d, %d)", p, Low, Low+Span)
		}
		if seen[p] {
			t.Fatalf("port %d given twice while held", p)
		}
		seen[p] = true
	}
	p, err := Port("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		t.Fatalf("the port Port gave cannot be bound: %v", err)
	}
	ln.Close()
}

// TestAddrsDistinct: Addrs gives n distinct addresses of Range on the host.
func TestAddrsDistinct(t *testing.T) {
	addrs, err := Addrs("127.0.0.1", 20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		p, _ := strconv.Atoi(port)
		if err != nil || host != "127.0.0.1" || p < Low || p >= Low+Span || seen[a] {
			t.Fatalf("addresses %v: %q is not a distinct one of 127.0.0.1:[%d, %d)", addrs, a, Low, Low+Span)
		}
		seen[a] = true
	}
}
