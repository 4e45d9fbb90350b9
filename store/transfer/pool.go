package transfer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// connPool keeps authenticated connections to servers between pulls, so that a
// pull reuses them instead of dialing and authenticating again (a dial, a TLS
// handshake and the token's challenge/response are several round trips: for a
// small object they cost more than the object).
//
// Health: a server that closes a connection, or a connection that breaks, is
// noticed by the connection's reader at once (Conn.Closed), and such a
// connection is never handed out again. One idle longer than IdleTimeout is
// closed instead of reused. One idle for HealthCheckAfter is pinged before use
// (Client.conn), which finds a connection whose peer vanished without a word.
// Should one still fail the pull's first request, the puller retries that
// request once on a freshly dialed connection before it calls the source dead
// (see puller.open).
type connPool struct {
	max     int // idle connections kept per address; <= 0: none
	timeout time.Duration
	m       *Metrics

	mu     sync.Mutex
	idle   map[string][]pooled // by address; the most recently returned last
	closed bool
}

type pooled struct {
	c     *Conn
	since time.Time
}

func newConnPool(max int, timeout time.Duration, m *Metrics) *connPool {
	return &connPool{max: max, timeout: timeout, m: m, idle: map[string][]pooled{}}
}

// get returns an idle connection to addr whose reader still runs, and how long
// it was idle, or nil. Broken and expired connections it meets on the way are
// closed.
func (p *connPool) get(addr string) (*Conn, time.Duration) {
	now := time.Now()
	var drop []*Conn
	defer func() {
		for _, c := range drop {
			c.Close()
		}
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.idle[addr]
	for len(list) > 0 {
		it := list[len(list)-1]
		list = list[:len(list)-1]
		if !it.c.idle() || now.Sub(it.since) > p.timeout {
			p.m.ConnsEvicted.Inc()
			drop = append(drop, it.c)
			continue
		}
		p.idle[addr] = list
		p.m.ConnsReused.Inc()
		return it.c, now.Sub(it.since)
	}
	delete(p.idle, addr)
	return nil, 0
}

// put returns c for reuse, or closes it: when it is broken or busy, the pool
// is full or disabled, or closed. It also closes connections to any address
// that have been idle longer than the timeout.
func (p *connPool) put(c *Conn) {
	now := time.Now()
	var drop []*Conn
	p.mu.Lock()
	if p.closed || p.max <= 0 || !c.idle() {
		drop = append(drop, c)
	} else {
		p.idle[c.addr] = append(p.idle[c.addr], pooled{c: c, since: now})
		if l := p.idle[c.addr]; len(l) > p.max {
			drop = append(drop, l[0].c)
			p.idle[c.addr] = l[1:]
		}
	}
	for addr, l := range p.idle {
		keep := l[:0]
		for _, it := range l {
			if now.Sub(it.since) > p.timeout {
				p.m.ConnsEvicted.Inc()
				drop = append(drop, it.c)
			} else {
				keep = append(keep, it)
			}
		}
		if len(keep) == 0 {
			delete(p.idle, addr)
		} else {
			p.idle[addr] = keep
		}
	}
	p.mu.Unlock()
	for _, c := range drop {
		c.Close()
	}
}

// close closes every idle connection; later puts close theirs.
func (p *connPool) close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = map[string][]pooled{}
	p.mu.Unlock()
	for _, l := range idle {
		for _, it := range l {
			it.c.Close()
		}
	}
}

// conn returns a connection to addr: a pooled one if there is a healthy one,
// else a new one. fresh reports that it was just dialed. A pooled connection
// idle for HealthCheckAfter or more is pinged first; one that does not answer
// within DialTimeout is closed and the next one tried. The pool holds at most
// MaxIdlePerPeer connections per address, so this ends.
func (cl *Client) conn(ctx context.Context, addr string) (c *Conn, fresh bool, err error) {
	for {
		c, idle := cl.pool.get(addr)
		if c == nil {
			break
		}
		if cl.cfg.HealthCheckAfter < 0 || idle < cl.cfg.HealthCheckAfter {
			return c, false, nil
		}
		pctx, cancel := context.WithTimeout(ctx, cl.cfg.DialTimeout)
		err := c.Ping(pctx)
		cancel()
		if err == nil {
			return c, false, nil
		}
		if ctx.Err() != nil {
			cl.pool.put(c)
			return nil, false, fmt.Errorf("transfer: connection to %s: %w", addr, ctx.Err())
		}
		cl.m.ConnsEvicted.Inc()
		cl.log.Info("pooled connection failed its health check", zap.String("addr", addr), zap.Error(err))
		c.Close()
	}
	c, err = cl.Dial(ctx, addr)
	return c, true, err
}

// answered reports whether err is the server's answer to a request (it
// refused it), rather than a failure of the connection.
func answered(err error) bool {
	return errors.Is(err, ErrRemote) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrBadKey) ||
		errors.Is(err, ErrRange) || errors.Is(err, ErrObjectLost)
}
