// Package member is Atoll's gossip membership and failure detection, on hashicorp/serf:
// heads and agents are members; a head learns that an agent failed (or left) from serf and
// its leader then moves that machine's gangs. Gossip is encrypted and authenticated with a
// key derived from the cluster secret, so a process without it cannot join or forge
// membership.
package member

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"
	"go.uber.org/zap"
)

// Roles a member announces in its tags.
const (
	RoleHead  = "head"
	RoleAgent = "agent"
)

// Config configures a member.
type Config struct {
	// Name is the member's name: the machine name for an agent, "head-<id>" for a head.
	Name string
	// Role is RoleHead or RoleAgent.
	Role string
	// Bind is host:port to gossip on (port 0: a free one); Advertise, when set, is the
	// address others use.
	Bind, Advertise string
	// Secret is the cluster secret; the gossip key is derived from it (GossipKey). Key,
	// when set, is the gossip key itself (an agent with a scoped credential is given it,
	// not the secret).
	Secret []byte
	Key    []byte
	// Tags are announced with the member (its API address...).
	Tags map[string]string
	// ProbeInterval sets how often a member probes another (failure detection speed).
	// Default 500 ms: a killed agent is declared dead within a few seconds.
	ProbeInterval time.Duration
	// Logger (default no-op).
	Logger *zap.Logger
}

// Event is a member failing, leaving or joining.
type Event struct {
	Name string
	Role string
	// Kind is "join", "failed", "left" or "update".
	Kind string
	Tags map[string]string
}

// Member is this process's membership.
type Member struct {
	s    *serf.Serf
	ch   chan serf.Event
	log  *zap.Logger
	addr string

	mu       sync.Mutex
	handlers []func(Event)
	done     chan struct{}
}

// Start starts gossiping (joining nobody yet: call Join).
func Start(cfg Config) (*Member, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	key := cfg.Key
	switch {
	case key != nil && len(key) != 32:
		return nil, fmt.Errorf("member: the gossip key has %d bytes, want 32", len(key))
	case key == nil && len(cfg.Secret) < 16:
		return nil, fmt.Errorf("member: the cluster secret has %d bytes, want at least 16", len(cfg.Secret))
	case key == nil:
		key = GossipKey(cfg.Secret)
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = 500 * time.Millisecond
	}
	if cfg.Bind == "" {
		cfg.Bind = "127.0.0.1:0"
	}
	host, portS, err := net.SplitHostPort(cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("member: bind address %q: %w", cfg.Bind, err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil {
		return nil, fmt.Errorf("member: bind port %q: %w", portS, err)
	}
	if port == 0 { // memberlist binds TCP and UDP on one port: find one free for both
		if port, err = freePort(host); err != nil {
			return nil, err
		}
	}
	mc := memberlist.DefaultLocalConfig()
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertiseAddr, mc.AdvertisePort = host, port
	if cfg.Advertise != "" {
		ah, ap, err := net.SplitHostPort(cfg.Advertise)
		if err != nil {
			return nil, fmt.Errorf("member: advertise address %q: %w", cfg.Advertise, err)
		}
		if net.ParseIP(ah) == nil { // memberlist wants an IP: resolve a host name (a container's)
			ips, err := net.LookupIP(ah)
			if err != nil || len(ips) == 0 {
				return nil, fmt.Errorf("member: advertise host %q does not resolve: %v", ah, err)
			}
			ah = ips[0].String()
			for _, ip := range ips {
				if ip.To4() != nil {
					ah = ip.String()
					break
				}
			}
		}
		mc.AdvertiseAddr = ah
		if mc.AdvertisePort, err = strconv.Atoi(ap); err != nil {
			return nil, fmt.Errorf("member: advertise port %q: %w", ap, err)
		}
	}
	mc.SecretKey = key
	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeInterval / 2
	mc.GossipInterval = 200 * time.Millisecond // memberlist's LAN default: a wake-up less per 200 ms when idle
	// Gossip messages are a few hundred bytes: compressing each (LZW, a new writer per
	// message) cost more CPU than anything else in an idle cluster's gossip.
	mc.EnableCompression = false
	mc.SuspicionMult = 3
	mc.LogOutput = io.Discard
	sc := serf.DefaultConfig()
	sc.NodeName = cfg.Name
	sc.Tags = map[string]string{"role": cfg.Role}
	for k, v := range cfg.Tags {
		sc.Tags[k] = v
	}
	sc.MemberlistConfig = mc
	sc.Logger = log.New(zap.NewStdLog(cfg.Logger.Named("serf")).Writer(), "", 0)
	sc.ReapInterval = 5 * time.Second
	// A planned stop announces itself and goes: a leave is not worth seconds of shutdown.
	sc.BroadcastTimeout = time.Second
	sc.LeavePropagateDelay = 100 * time.Millisecond
	sc.ReconnectTimeout = time.Minute
	sc.TombstoneTimeout = time.Minute
	ch := make(chan serf.Event, 256)
	sc.EventCh = ch
	s, err := serf.Create(sc)
	if err != nil {
		return nil, fmt.Errorf("member: start gossip on %s:%d: %w", host, port, err)
	}
	m := &Member{s: s, ch: ch, log: cfg.Logger.Named("member"), addr: net.JoinHostPort(mc.AdvertiseAddr, strconv.Itoa(mc.AdvertisePort)), done: make(chan struct{})}
	go m.loop()
	return m, nil
}

func freePort(host string) (int, error) {
	for i := 0; i < 20; i++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, fmt.Errorf("member: pick a port: %w", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", net.JoinHostPort(host, strconv.Itoa(port)))
		ln.Close()
		if err == nil {
			pc.Close()
			return port, nil
		}
	}
	return 0, fmt.Errorf("member: no port free for both TCP and UDP on %s", host)
}

// Address is where this member gossips (host:port), for others to Join.
func (m *Member) Address() string { return m.addr }

// Join contacts existing members (their gossip addresses); it succeeds when one answers.
func (m *Member) Join(addrs []string) error {
	if len(addrs) == 0 {
		return nil
	}
	n, err := m.s.Join(addrs, true)
	if n == 0 && err != nil {
		return fmt.Errorf("member: join %v: %w", addrs, err)
	}
	return nil
}

// OnEvent adds a handler for membership events; handlers run one at a time on the
// member's goroutine and must not block.
func (m *Member) OnEvent(h func(Event)) {
	m.mu.Lock()
	m.handlers = append(m.handlers, h)
	m.mu.Unlock()
}

func (m *Member) loop() {
	defer close(m.done)
	for ev := range m.ch {
		me, ok := ev.(serf.MemberEvent)
		if !ok {
			continue
		}
		kind := ""
		switch me.Type {
		case serf.EventMemberJoin:
			kind = "join"
		case serf.EventMemberFailed:
			kind = "failed"
		case serf.EventMemberLeave, serf.EventMemberReap:
			kind = "left"
		case serf.EventMemberUpdate:
			kind = "update"
		default:
			continue
		}
		m.mu.Lock()
		hs := append([]func(Event){}, m.handlers...)
		m.mu.Unlock()
		for _, mem := range me.Members {
			e := Event{Name: mem.Name, Role: mem.Tags["role"], Kind: kind, Tags: mem.Tags}
			m.log.Info("membership", zap.String("member", e.Name), zap.String("role", e.Role), zap.String("event", kind))
			for _, h := range hs {
				h(e)
			}
		}
	}
}

// Alive lists the members of a role that gossip says are alive.
func (m *Member) Alive(role string) map[string]bool {
	out := map[string]bool{}
	for _, mem := range m.s.Members() {
		if mem.Status == serf.StatusAlive && (role == "" || mem.Tags["role"] == role) {
			out[mem.Name] = true
		}
	}
	return out
}

// Tags returns the tags of the alive members of a role, by member name.
func (m *Member) Tags(role string) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, mem := range m.s.Members() {
		if mem.Status == serf.StatusAlive && (role == "" || mem.Tags["role"] == role) {
			out[mem.Name] = mem.Tags
		}
	}
	return out
}

// Dead lists the members of a role that gossip knows failed or left (members it never
// heard of are not listed: a machine unknown to gossip is judged by its heartbeats).
func (m *Member) Dead(role string) map[string]bool {
	out := map[string]bool{}
	for _, mem := range m.s.Members() {
		if (mem.Status == serf.StatusFailed || mem.Status == serf.StatusLeft) && (role == "" || mem.Tags["role"] == role) {
			out[mem.Name] = true
		}
	}
	return out
}

// Leave tells the others this member is leaving (a planned stop), then stops gossiping.
func (m *Member) Leave() error {
	return errors.Join(m.s.Leave(), m.Shutdown())
}

// Shutdown stops gossiping without a word (others will find it failed).
func (m *Member) Shutdown() error {
	return m.s.Shutdown()
}

// GossipKey is the gossip's encryption key (AES-256) derived from the cluster secret.
func GossipKey(secret []byte) []byte {
	key := sha256.Sum256(append([]byte("atoll serf gossip key\x00"), secret...))
	return key[:]
}
