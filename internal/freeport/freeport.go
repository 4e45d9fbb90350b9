// Package freeport picks TCP ports that are free now for another process to bind a moment
// later (a new cluster's heads and agents, a process gang's rendezvous).
//
// The ports come from below the kernel's ephemeral range (ip_local_port_range, 32768 and
// up by default), picked at random: a port from the ephemeral range (":0") can be taken in
// between as the source port of any outgoing connection on the machine, a port below it
// only by another program that binds it explicitly. torchrun's MASTER_PORT default (29500)
// sits there for the same reason. CI saw a head fail to bind an ephemeral port it had been
// given, and a process gang's rank 0 exit at once in a way this explains (its log was not
// kept).
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
)

// Range is where ports are tried first: [Low, Low+Span).
const (
	Low  = 20000
	Span = 12000
)

// tries is how many ports of the range are tried before an ephemeral one is taken.
const tries = 64

// Listen listens on a free port of host ("" for every interface): one of Range when
// any of tries random ones is free, else the kernel's choice. The caller closes it, then
// hands its port to whoever binds it.
func Listen(host string) (net.Listener, error) {
	for range tries {
		if ln, err := net.Listen("tcp", net.JoinHostPort(host, fmt.Sprint(Low+rand.IntN(Span)))); err == nil {
			return ln, nil
		}
	}
	return net.Listen("tcp", net.JoinHostPort(host, "0"))
}

// Addrs returns n distinct addresses (host:port) of host free now: Listen's, all held
// until the last is picked (so none is given twice), then closed.
func Addrs(host string, n int) ([]string, error) {
	out := make([]string, 0, n)
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := Listen(host)
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	return out, nil
}

// Port returns a port of host free now (Listen's, closed at once).
func Port(host string) (int, error) {
	ln, err := Listen(host)
	if err != nil {
		return 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	return port, ln.Close()
}
