// Package tlsgate serves TLS on a listener with a bound on the handshakes in progress.
//
// crypto/tls's own listener (tls.NewListener) hands every accepted connection on at once,
// and net/http runs each one's handshake on a goroutine of its own: a thousand clients
// that reconnect together (every agent of a cluster, when its leader head dies) make a
// thousand runnable goroutines doing public-key arithmetic, and every other goroutine of
// the process, a Paxos replica's included, waits its turn behind them. At 1,000 hollow
// machines the new leader's goroutines waited up to 1.9 s to run while 30% of its CPU went
// to handshakes, its Paxos followers' acknowledgments came late, and loading its term
// took 4 s (BENCHMARKS.md, "Handshakes off the run queue"). Here at most Limit handshakes
// run at once; the other connections wait for a slot on a blocked goroutine, which costs
// no CPU and takes no place in the run queue, in the order they came.
package tlsgate

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"time"
)

// Config configures a Listener.
type Config struct {
	// TLS is the server's configuration.
	TLS *tls.Config
	// Limit is how many handshakes run at once (at least 1).
	Limit int
	// Timeout bounds one handshake from the moment it has a slot (default 10 s): a client
	// that sends nothing holds a slot no longer.
	Timeout time.Duration
	// OnError, when set, is told of each failed handshake (net/http logs them when it does
	// the handshakes itself).
	OnError func(remote net.Addr, err error)
	// onWait, when set (by tests), runs when a connection waits for a slot.
	onWait func()
}

// Listener is a net.Listener whose Accept returns *tls.Conn connections whose handshake
// is done.
type Listener struct {
	inner net.Listener
	cfg   Config
	slots chan struct{}
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	err   error // why the inner listener stopped
}

// New serves TLS on inner and starts accepting from it; Close stops it.
func New(inner net.Listener, cfg Config) *Listener {
	if cfg.Limit < 1 {
		cfg.Limit = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	l := &Listener{inner: inner, cfg: cfg, slots: make(chan struct{}, cfg.Limit), conns: make(chan net.Conn), done: make(chan struct{})}
	go l.acceptLoop()
	return l
}

// acceptLoop accepts connections from the inner listener, each handed to a goroutine that
// waits for a slot and shakes hands, until the inner listener fails for good.
func (l *Listener) acceptLoop() {
	var pause time.Duration
	for {
		c, err := l.inner.Accept()
		if err != nil {
			// Out of descriptors and the like (the errors that still say they are
			// temporary): wait and try again, as net/http's Serve does.
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(pause):
					continue
				case <-l.done:
				}
			}
			l.stop(err)
			return
		}
		pause = 0
		go l.handshake(c)
	}
}

// handshake waits for a slot, shakes hands within the timeout and hands the connection to
// Accept; a failed one is closed.
func (l *Listener) handshake(c net.Conn) {
	select {
	case l.slots <- struct{}{}:
	default:
		if l.cfg.onWait != nil {
			l.cfg.onWait()
		}
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			_ = c.Close()
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.Timeout)
	tc := tls.Server(c, l.cfg.TLS)
	err := tc.HandshakeContext(ctx)
	cancel()
	<-l.slots
	if err != nil {
		if l.cfg.OnError != nil {
			l.cfg.OnError(c.RemoteAddr(), err)
		}
		_ = c.Close()
		return
	}
	select {
	case l.conns <- tc:
	case <-l.done:
		_ = tc.Close()
	}
}

// Accept returns the next connection whose handshake is done.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		l.mu.Lock()
		defer l.mu.Unlock()
		return nil, l.err
	}
}

// stop ends the listener with err (what Accept returns from then on).
func (l *Listener) stop(err error) {
	l.once.Do(func() {
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
		close(l.done)
	})
}

// Close closes the inner listener; Accept returns net.ErrClosed, connections waiting for
// a slot are closed, and those shaking hands are closed when their handshake ends.
func (l *Listener) Close() error {
	l.stop(net.ErrClosed)
	return l.inner.Close()
}

// Addr is the inner listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }
