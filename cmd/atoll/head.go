package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/head"
	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/store/paxos"
)

// parsePeers parses "1=host:port,2=host:port".
func parsePeers(s string) (map[uint64]string, error) {
	out := map[uint64]string{}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		idS, addr, ok := strings.Cut(part, "=")
		id, err := strconv.ParseUint(idS, 10, 16)
		if !ok || err != nil || id == 0 || addr == "" {
			return nil, fmt.Errorf("--peers entry %d %q: want id=host:port with id in 1..65535", i+1, part)
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("--peers entry %d %q: id %d listed twice", i+1, part, id)
		}
		out[id] = addr
	}
	return out, nil
}

// parseIDs parses "1,2,3".
func parseIDs(s string) ([]uint64, error) {
	var out []uint64
	for i, part := range strings.Split(s, ",") {
		id, err := strconv.ParseUint(strings.TrimSpace(part), 10, 16)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("entry %d %q: want a replica id in 1..65535", i+1, part)
		}
		if slices.Contains(out, id) {
			return nil, fmt.Errorf("entry %d %q: id listed twice", i+1, part)
		}
		out = append(out, id)
	}
	slices.Sort(out)
	return out, nil
}

// readToken reads the cluster secret from a file (mode 0600 checked) or, failing that, from
// $ATOLL_TOKEN_FILE or $ATOLL_TOKEN. Secrets never come from the command line, where `ps`
// would show them.
func readToken(file string) ([]byte, error) {
	if file == "" {
		file = os.Getenv("ATOLL_TOKEN_FILE")
	}
	if file != "" {
		return sdk.ReadTokenFile(file)
	}
	if t := os.Getenv("ATOLL_TOKEN"); t != "" {
		if len(t) < 16 {
			return nil, fmt.Errorf("$ATOLL_TOKEN has %d bytes, want at least 16", len(t))
		}
		return []byte(t), nil
	}
	return nil, errors.New("no cluster token: pass --token-file (mode 0600), or set ATOLL_TOKEN_FILE or ATOLL_TOKEN")
}

// loopback reports whether a listen address is on the loopback interface.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// gossipProbeUsage documents --gossip-probe, the same for heads, agents and atoll up.
const gossipProbeUsage = "how often gossip probes each member: a member that misses a few probes in a row is declared failed; raise it on an overloaded host, where a busy agent may be taken for a dead one (failover then takes longer)"

func gossipAddrOrNone(g string) []string {
	if g == "" || g == "none" {
		return nil
	}
	return []string{g}
}

// timingFlags declares --tick and --election-timeout (atoll head, atoll up).
func timingFlags(f *pflag.FlagSet, tick, election *time.Duration) {
	f.DurationVar(tick, "tick", head.DefaultTick, "Paxos tick: the heads' timer resolution, 1ms..1s")
	f.DurationVar(election, "election-timeout", head.DefaultElectionTimeout,
		fmt.Sprintf("silence of the leader after which a head asks for an election (randomized up to twice this; heartbeats go out five times as often), at least %d ticks", paxos.MinElectionTicks))
}

// checkTiming validates --tick and --election-timeout as a head will use them.
func checkTiming(tick, election time.Duration) error {
	if tick < time.Millisecond || tick > time.Second {
		return fmt.Errorf("--tick %v: want 1ms..1s", tick)
	}
	var rc paxos.ReplicaConfig
	if err := rc.SetTiming(tick, election); err != nil {
		return fmt.Errorf("--election-timeout %v with --tick %v: want %d ticks (%v) to %v", election, tick, paxos.MinElectionTicks, paxos.MinElectionTicks*tick, paxos.MaxElectionTimeout)
	}
	return nil
}

// newHeadCmd is `atoll head`: one head of the cluster: a replica of the Paxos metadata log
// and, while it leads, the control plane (scheduler, gangs, restarts, membership).
func newHeadCmd() *cobra.Command {
	var (
		id           uint64
		idOrdinal    bool
		listen       string
		peersFlag    string
		clientListen string
		dataDir      string
		tokenFile    string
		noFsync      bool
		tick         time.Duration
		election     time.Duration
		join         bool
		initialFlag  string
		gossip       string
		gossipJoin   string
		gossipProbe  time.Duration
		heartbeat    time.Duration
		reportRate   float64
		handshakes   int
		inflight     int
		http2        bool
		keepEnded    int
		schedWeights string
		advertise    string
		caDir        string
		insecure     bool
		poolsOpt     poolsOptions
	)
	cmd := &cobra.Command{
		Use:   "head",
		Short: "Run one head: a replica of the Paxos metadata log and, on the leader, the control plane",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			token, err := readToken(tokenFile)
			if err != nil {
				return fmt.Errorf("head: %w", err)
			}
			if dataDir == "" {
				return errors.New("head: --data-dir is required")
			}
			if err := envProfile(fmt.Sprintf("head-%d", id)); err != nil {
				return fmt.Errorf("head: %w", err)
			}
			if idOrdinal {
				if id != 0 {
					return fmt.Errorf("head: --id %d and --id-from-ordinal contradict each other", id)
				}
				host, err := os.Hostname()
				if err != nil {
					return fmt.Errorf("head: --id-from-ordinal: %w", err)
				}
				if id, err = ordinalID(host); err != nil {
					return fmt.Errorf("head: --id-from-ordinal: %w", err)
				}
			}
			if id == 0 || id > 65535 {
				return fmt.Errorf("head: --id %d: want a replica id in 1..65535", id)
			}
			if err := checkTiming(tick, election); err != nil {
				return fmt.Errorf("head: %w", err)
			}
			peers, err := parsePeers(peersFlag)
			if err != nil {
				return fmt.Errorf("head: %w", err)
			}
			if listen == "" {
				listen = peers[id]
			}
			if listen == "" {
				return fmt.Errorf("head: --id %d is not in --peers %q and no --listen was given: where should it listen?", id, peersFlag)
			}
			if _, ok := peers[id]; !ok {
				peers[id] = listen
			}
			var ids []uint64
			for p := range peers {
				ids = append(ids, p)
			}
			slices.Sort(ids)
			if initialFlag != "" {
				ids, err = parseIDs(initialFlag)
				if err != nil {
					return fmt.Errorf("head: --initial-members: %w", err)
				}
				if !join && !slices.Contains(ids, id) {
					return fmt.Errorf("head: --initial-members %s does not include --id %d (a replica added later runs with --join)", initialFlag, id)
				}
			}
			logger, err := zap.NewProduction()
			if err != nil {
				return err
			}
			defer logger.Sync()
			var gj []string
			for _, a := range strings.Split(gossipJoin, ",") {
				if a = strings.TrimSpace(a); a != "" {
					gj = append(gj, a)
				}
			}
			if gossip == "none" {
				gossip = ""
			}
			if caDir == "" {
				caDir = os.Getenv("ATOLL_CA_DIR")
			}
			var ca *pki.CA
			switch {
			case caDir != "" && insecure:
				return errors.New("head: --ca-dir and --insecure-no-tls contradict each other")
			case caDir != "":
				if ca, err = pki.LoadCA(caDir); err != nil {
					return fmt.Errorf("head: --ca-dir: %w", err)
				}
			case !insecure:
				for _, a := range append([]string{clientListen, listen}, gossipAddrOrNone(gossip)...) {
					if !loopback(a) {
						return fmt.Errorf("head: %s is not a loopback address and the head has no cluster CA: give --ca-dir (atoll init --dir D creates D/tls), or --insecure-no-tls to serve with the token alone, in clear", a)
					}
				}
			}
			scheme := "http"
			if ca != nil {
				scheme = "https"
			}
			var apiAdv, gossipAdv string
			if advertise != "" {
				_, port, err := net.SplitHostPort(clientListen)
				if err != nil || port == "0" {
					return fmt.Errorf("head: --advertise needs a fixed --client-listen port (got %q)", clientListen)
				}
				apiAdv = scheme + "://" + net.JoinHostPort(advertise, port)
				if _, gp, err := net.SplitHostPort(gossip); err == nil && gp != "0" {
					gossipAdv = net.JoinHostPort(advertise, gp)
				}
			}
			ctl, err := headControllerConfig(heartbeat, schedWeights)
			if err != nil {
				return err
			}
			ctl.KeepEndedGangs, ctl.ReportRate = keepEnded, reportRate
			if handshakes < 0 {
				return fmt.Errorf("head: --max-handshakes %d: want 0 (GOMAXPROCS) or more", handshakes)
			}
			if inflight < 0 {
				return fmt.Errorf("head: --max-inflight %d: want 0 (no bound) or more", inflight)
			}
			h, err := head.Start(head.Config{ID: id, Peers: peers, Initial: ids, Join: join, DataDir: dataDir, NoSync: noFsync, Tick: tick, ElectionTimeout: election,
				APIListen: clientListen, APIAdvertise: apiAdv, Token: token, CA: ca, CADir: caDir, Gossip: gossip, GossipJoin: gj, GossipAdvertise: gossipAdv,
				GossipProbe: gossipProbe, MaxHandshakes: handshakes, MaxInflight: inflight, HTTP2: http2, Controller: ctl, Logger: logger})
			if err != nil {
				return err
			}
			defer h.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "client-api %s\n", h.Address())
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if err := startPools(ctx, h.Controller(), poolsOpt, dataDir, h.Address(), token, h.CallAgent, logger); err != nil {
				return fmt.Errorf("head: %w", err)
			}
			<-ctx.Done()
			return nil
		},
	}
	f := cmd.Flags()
	f.Uint64Var(&id, "id", 0, "this replica's id (1..65535), one of --peers")
	f.BoolVar(&idOrdinal, "id-from-ordinal", false, "take --id from this host's name: 1 + the number after its last '-' (a Kubernetes StatefulSet's pod atoll-head-0 is head 1)")
	f.StringVar(&listen, "listen", "", "address for replica-to-replica traffic (default: this id's --peers address)")
	f.StringVar(&peersFlag, "peers", "", "every replica as id=host:port,... (this one included)")
	f.StringVar(&clientListen, "client-listen", "127.0.0.1:0", "address of the HTTP API (clients, agents, workers)")
	f.StringVar(&dataDir, "data-dir", "", "directory of this replica's WAL")
	f.StringVar(&tokenFile, "token-file", "", "file holding the cluster token, mode 0600 (default $ATOLL_TOKEN_FILE, or $ATOLL_TOKEN)")
	f.BoolVar(&noFsync, "no-fsync", false, "do not fsync the WAL (unsafe: acknowledged writes may be lost on power loss)")
	timingFlags(f, &tick, &election)
	f.BoolVar(&join, "join", false, "this replica is being added to a running group (POST /v1/members/add at the leader): it learns the log and votes once a configuration including it is chosen; always restart it with --join")
	f.StringVar(&initialFlag, "initial-members", "", "ids of the group's first configuration, comma-separated (default: every id in --peers); keep it the same across restarts")
	f.StringVar(&gossip, "gossip", "127.0.0.1:0", "address to gossip on with the agents (serf membership and failure detection); \"none\" turns it off")
	f.StringVar(&gossipJoin, "gossip-join", "", "other heads' gossip addresses, comma-separated")
	f.DurationVar(&gossipProbe, "gossip-probe", 500*time.Millisecond, gossipProbeUsage)
	f.StringVar(&advertise, "advertise", "", "host the other machines reach this head at, when it listens on 0.0.0.0 (a container's name)")
	f.StringVar(&caDir, "ca-dir", "", "the cluster CA's directory (ca.crt, ca.key; atoll init creates it): Paxos links and the API are mutual TLS, and the head signs the certificates of processes that hold the token (default $ATOLL_CA_DIR)")
	f.BoolVar(&insecure, "insecure-no-tls", false, "serve without TLS, on the token alone (links in clear): only for a trusted network; without a CA and without this flag a head listens on loopback only")
	poolsOpt.flags(cmd)
	f.StringVar(&schedWeights, "scheduler-weights", "", "scheduler weights file written by atoll tune (priority, score, class and preemption weights of the gang scheduler; default: the hand-set ones)")
	f.DurationVar(&heartbeat, "heartbeat-timeout", 10*time.Second, "declare a machine dead after this long without its agent's load reports (a backstop to gossip)")
	f.Float64Var(&reportRate, "report-rate", head.DefaultReportRate, "load reports a second the leader takes from all machines together: past that many machines it asks each agent for one every machines/rate seconds, up to a third of --heartbeat-timeout; negative: never asks")
	f.IntVar(&inflight, "max-inflight", 0, "API requests served at once, long polls aside (0: no bound); the load reports have as many slots of their own, a request waiting for a commit gives its slot back, and one over the bound waits up to a second, then is answered 503")
	f.BoolVar(&http2, "http2", false, "offer HTTP/2 on the API (HTTP/1.1 is served either way): a process's requests share one connection to the head; about twice HTTP/1.1's CPU per request")
	f.IntVar(&handshakes, "max-handshakes", 0, "TLS handshakes of the API in progress at once (0: GOMAXPROCS); further connections wait without using CPU. A handshake holds its slot while it waits for a slow client too")
	f.IntVar(&keepEnded, "keep-ended-gangs", head.DefaultKeepEndedGangs, "ended (stopped or failed) gangs whose records the leader keeps; it deletes the oldest beyond them, with their worker records (checkpoints stay); -1 keeps every one, 0 the default")
	return cmd
}

// ordinalID is the head id of a StatefulSet pod's host name: its ordinal (the number
// after the last '-') plus one.
func ordinalID(host string) (uint64, error) {
	i := strings.LastIndexByte(host, '-')
	if i < 0 || i == len(host)-1 {
		return 0, fmt.Errorf("host name %q does not end in -N (a StatefulSet pod's ordinal)", host)
	}
	n, err := strconv.ParseUint(host[i+1:], 10, 16)
	if err != nil || n >= 65535 {
		return 0, fmt.Errorf("host name %q: ordinal %q is not a number in 0..65534", host, host[i+1:])
	}
	return n + 1, nil
}

// headControllerConfig is the controller's configuration: the heartbeat timeout, and the
// scheduler weights of weightsPath set on the head's scheduler configuration (none: the
// hand-set defaults).
func headControllerConfig(heartbeat time.Duration, weightsPath string) (head.ControllerConfig, error) {
	c := head.ControllerConfig{HeartbeatTimeout: heartbeat}
	if weightsPath == "" {
		return c, nil
	}
	w, err := gang.ReadWeightsFile(weightsPath)
	if err != nil {
		return c, fmt.Errorf("head: --scheduler-weights: %w", err)
	}
	c.Scheduler = head.DefaultSchedulerConfig()
	w.Apply(&c.Scheduler)
	return c, nil
}
