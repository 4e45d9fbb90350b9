package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/internal/freeport"
	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/pools"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/sdk"
)

// clusterFile is what `atoll up` writes in its directory: how to reach the cluster and the
// processes it started.
type clusterFile struct {
	Address   string `json:"address"`
	TokenFile string `json:"token_file"`
	// CACert is the cluster CA's certificate (empty when the cluster runs without TLS).
	CACert  string     `json:"ca_cert,omitempty"`
	Machine string     `json:"machine"`
	Heads   []procInfo `json:"heads"`
	Agents  []procInfo `json:"agents"`
	Started time.Time  `json:"started"`
	// Pools is the pool file the heads run the autoscaler with ("" without).
	Pools string `json:"pools,omitempty"`
	// GossipProbe and HeartbeatTimeout are the failure detection the heads and agents were
	// started with ("" for their defaults), kept so that a restart runs them the same.
	GossipProbe      string `json:"gossip_probe,omitempty"`
	HeartbeatTimeout string `json:"heartbeat_timeout,omitempty"`
	// ReportRate is the heads' --report-rate ("" for their default).
	ReportRate string `json:"report_rate,omitempty"`
	// MaxHandshakes is the heads' --max-handshakes ("" for their default).
	MaxHandshakes string `json:"max_handshakes,omitempty"`
	// MaxInflight is the heads' --max-inflight ("" for their default, no bound).
	MaxInflight string `json:"max_inflight,omitempty"`
	// HTTP2 is the heads' --http2.
	HTTP2 bool `json:"http2,omitempty"`
	// Tick and ElectionTimeout are the heads' Paxos timing ("" for their defaults).
	Tick            string `json:"tick,omitempty"`
	ElectionTimeout string `json:"election_timeout,omitempty"`
	// AgentArgs are the options its agents run with (atoll up --reconcile-interval,
	// --max-object-size, --checkpoint-dir, --trusted-fabric).
	AgentArgs []string `json:"agent_args,omitempty"`
}

// upOptions are what a cluster of `atoll up` takes beyond its shape.
type upOptions struct {
	// poolFile makes the heads run the pools autoscaler with the local provider.
	poolFile string
	// gossipProbe and heartbeatTimeout set the failure detection of the heads and agents
	// (0: their defaults).
	gossipProbe, heartbeatTimeout time.Duration
	// tick and election are the heads' Paxos timing (0: their defaults).
	tick, election time.Duration
	// reportRate is the heads' --report-rate (0: their default).
	reportRate float64
	// handshakes is the heads' --max-handshakes (0: their default).
	handshakes int
	// inflight is the heads' --max-inflight (0: their default, no bound).
	inflight int
	// http2 is the heads' --http2.
	http2 bool
	// agent are the agents' object store options.
	agent agentOptions
}

// agentOptions are the agents' object store options (0, "": their defaults).
type agentOptions struct {
	reconcileInterval time.Duration
	maxObjectSize     int64
	checkpointDir     string
	trustedFabric     bool
}

// args are the agents' flags for the options.
func (o agentOptions) args() []string {
	var a []string
	if o.reconcileInterval > 0 {
		a = append(a, "--reconcile-interval", o.reconcileInterval.String())
	}
	if o.maxObjectSize > 0 {
		a = append(a, "--max-object-size", strconv.FormatInt(o.maxObjectSize, 10))
	}
	if o.checkpointDir != "" {
		if abs, err := filepath.Abs(o.checkpointDir); err == nil {
			a = append(a, "--checkpoint-dir", abs)
		}
	}
	if o.trustedFabric {
		a = append(a, "--trusted-fabric")
	}
	return a
}

// procInfo is one process `atoll up` started, with what identifies it (procs.go).
type procInfo struct {
	ID     uint64 `json:"id,omitempty"`
	Name   string `json:"name"`
	API    string `json:"api,omitempty"`
	Paxos  string `json:"paxos,omitempty"`
	Gossip string `json:"gossip,omitempty"`
	PID    int    `json:"pid"`
	Log    string `json:"log"`
	// Dir is the process's own directory (a head's data, an agent's files).
	Dir string `json:"dir,omitempty"`
	// Start is the process's start time (/proc/PID/stat field 22, clock ticks since boot)
	// and Cmdline its command line, as the kernel said when it was started: a process that
	// reuses the pid differs in both.
	Start   uint64   `json:"start,omitempty"`
	Cmdline []string `json:"cmdline,omitempty"`
}

// The usages of --dir and --address of the commands that reach a running cluster (pflag
// shows the backquoted word as the flag's placeholder: --dir DIR).
const (
	dirUsage     = "the cluster in `DIR`, as atoll up --dir DIR started it"
	addressUsage = "the cluster at `ADDRESS`, as atoll address prints it (default $ATOLL_ADDRESS)"
)

const (
	clusterFileName = "cluster.json"
	tokenFileName   = "token"
)

// errNoCluster: no cluster runs in the directory a command was given (or at its address).
var errNoCluster = errors.New("no cluster runs")

func readClusterFile(dir string) (*clusterFile, error) {
	b, err := os.ReadFile(filepath.Join(dir, clusterFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s (it has no %s): atoll up --dir %s starts one", errNoCluster, dir, clusterFileName, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("%s is not a cluster's directory (atoll up --dir %s starts one): %w", dir, dir, err)
	}
	var cf clusterFile
	if err := json.Unmarshal(b, &cf); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, clusterFileName), err)
	}
	// Records of an older `atoll up` name no directory: it is where up puts them.
	if abs, err := filepath.Abs(dir); err == nil {
		for i := range cf.Heads {
			if cf.Heads[i].Dir == "" {
				cf.Heads[i].Dir = filepath.Join(abs, "heads", strconv.FormatUint(cf.Heads[i].ID, 10))
			}
		}
		for i := range cf.Agents {
			if cf.Agents[i].Dir == "" {
				cf.Agents[i].Dir = filepath.Join(abs, "agents", cf.Agents[i].Name)
			}
		}
	}
	return &cf, nil
}

// alive reports whether a process runs (a zombie, dead but not yet reaped by its parent,
// does not).
func alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no /proc: trust the signal
	}
	// The state follows the command name in parentheses: "pid (comm) S ...".
	if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z' && b[i+2] != 'X'
	}
	return true
}

// clusterAddress resolves --dir or --address (or $ATOLL_ADDRESS) to an address with its
// token file.
func clusterAddress(dir, address string) (string, *clusterFile, error) {
	switch {
	case dir != "" && address != "":
		return "", nil, errors.New("give --dir or --address, not both")
	case dir != "":
		abs, err := filepath.Abs(dir)
		if err != nil {
			return "", nil, err
		}
		cf, err := readClusterFile(abs)
		if err != nil {
			return "", nil, err
		}
		if !cf.headsRun() {
			return "", nil, fmt.Errorf("%w in %s: start one with atoll up --dir %s", errNoCluster, dir, dir)
		}
		addr := cf.Address + ";token-file=" + cf.TokenFile
		if cf.CACert != "" {
			addr += ";ca=" + cf.CACert
		}
		return addr, cf, nil
	case address != "":
		return address, nil, headsListen(address)
	case os.Getenv("ATOLL_ADDRESS") != "":
		return os.Getenv("ATOLL_ADDRESS"), nil, headsListen(os.Getenv("ATOLL_ADDRESS"))
	}
	return "", nil, errors.New("which cluster? give --dir DIR (of atoll up) or --address (or set ATOLL_ADDRESS)")
}

// headsRun reports whether a head of the cluster runs: a process of its records runs on
// this machine, or (the heads may run where this machine sees no process of theirs: in
// containers, on other machines) one of their addresses takes a connection. A stopped
// cluster is known at once: a connection to a closed port on this machine is refused.
func (cf *clusterFile) headsRun() bool {
	for _, h := range cf.Heads {
		if h.running() {
			return true
		}
	}
	var urls []string
	for _, h := range cf.Heads {
		urls = append(urls, h.API)
	}
	return anyListens(urls)
}

// headsListen checks that a head of an address takes a connection, so that a command
// against a stopped cluster says so at once instead of retrying until its deadline.
func headsListen(address string) error {
	a, err := sdk.ParseClusterAddress(address)
	if err != nil {
		return err
	}
	if !anyListens(a.Heads) {
		return fmt.Errorf("%w at %s: no head takes a connection (is the cluster up? atoll up --dir DIR starts one)", errNoCluster, strings.Join(a.Heads, ","))
	}
	return nil
}

// anyListens reports whether any of the URLs' hosts takes a TCP connection within a
// second (all are tried at once).
func anyListens(urls []string) bool {
	ok := make(chan bool, len(urls))
	for _, raw := range urls {
		go func() {
			u, err := url.Parse(raw)
			if err != nil || u.Host == "" {
				ok <- false
				return
			}
			c, err := net.DialTimeout("tcp", u.Host, time.Second)
			if err == nil {
				c.Close()
			}
			ok <- err == nil
		}()
	}
	for range urls {
		if <-ok {
			return true
		}
	}
	return false
}

// dialed is a connection of a command to a cluster: a client of its heads, its token, and
// an HTTP client for its agents' APIs (with this command's certificate when the cluster
// runs mutual TLS).
type dialed struct {
	*api.Client
	token string
	hc    *http.Client
}

// dialCluster connects to the heads at an address. When they are https, the command first
// gets a certificate of its own from them (with the token, checking them against the
// cluster CA of the address's ca=PATH or $ATOLL_CA_CERT).
func dialCluster(ctx context.Context, address string) (*dialed, error) {
	a, err := sdk.ParseClusterAddress(address)
	if err != nil {
		return nil, err
	}
	token, err := readToken(a.TokenFile)
	if err != nil {
		return nil, err
	}
	cc := api.ClientConfig{Heads: a.Heads, Token: string(token)}
	d := &dialed{token: string(token), hc: &http.Client{}}
	secure, err := api.Secure(a.Heads)
	if err != nil {
		return nil, err
	}
	if secure {
		caFile := a.CAFile
		if caFile == "" {
			caFile = os.Getenv(api.CACertEnv)
		}
		if caFile == "" {
			return nil, fmt.Errorf("the heads are https: give the cluster CA's certificate (the address's ;ca=PATH, or %s)", api.CACertEnv)
		}
		caPEM, err := pki.ReadCACert(caFile)
		if err != nil {
			return nil, err
		}
		host, _ := os.Hostname()
		id, err := api.RequestIdentity(ctx, a.Heads, string(token), caPEM, fmt.Sprintf("cli/%s/%d", host, os.Getpid()))
		if err != nil {
			return nil, err
		}
		cc.TLS = id.Client()
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = id.Client()
		d.hc = &http.Client{Transport: tr}
	}
	if d.Client, err = api.NewClient(ctx, cc); err != nil {
		return nil, err
	}
	return d, nil
}

// newSecret is 32 random bytes in hex: a cluster token.
func newSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// initDir creates a cluster directory with its token (mode 0600) and its CA (tls/ca.crt,
// tls/ca.key mode 0600), keeping those that exist. It returns the token file and the CA
// directory.
func initDir(dir string) (tokenFile, caDir string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", "", err
	}
	tf := filepath.Join(dir, tokenFileName)
	if _, err := os.Stat(tf); err == nil {
		if _, err := sdk.ReadTokenFile(tf); err != nil {
			return "", "", err
		}
	} else if err := os.WriteFile(tf, []byte(newSecret()+"\n"), 0o600); err != nil {
		return "", "", err
	}
	caDir = filepath.Join(dir, "tls")
	if _, err := os.Stat(filepath.Join(caDir, pki.CACertFile)); err == nil {
		if _, err := pki.LoadCA(caDir); err != nil {
			return "", "", err
		}
		return tf, caDir, nil
	}
	ca, err := pki.NewCA(filepath.Base(dir))
	if err != nil {
		return "", "", err
	}
	return tf, caDir, ca.Save(caDir)
}

func newInitCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create a cluster directory with its secret (the token file, mode 0600) and its certificate authority (tls/)",
		Long: `init creates a cluster directory: the token every process proves it holds (token, mode 0600),
and the cluster's certificate authority (tls/ca.crt, and tls/ca.key mode 0600). Heads hold the
CA (atoll head --ca-dir DIR/tls): every link between processes is mutual TLS, and a process that
holds the token gets its own certificate from the heads when it starts (agents, workers,
drivers and commands need only tls/ca.crt, with --ca-cert or the address's ;ca=PATH).
Existing files are kept.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("init: --dir is required")
			}
			tf, caDir, err := initDir(dir)
			if err != nil {
				return fmt.Errorf("init: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cluster secret in %s (mode 0600): give it to heads and agents with --token-file\n", tf)
			fmt.Fprintf(cmd.OutOrStdout(), "cluster CA in %s: heads take --ca-dir %s; agents and clients --ca-cert %s\n", caDir, caDir, filepath.Join(caDir, pki.CACertFile))
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the cluster's directory `DIR` to create")
	return cmd
}

// freeAddrs picks n loopback addresses free now for a new cluster's processes, which bind
// them a moment later (freeport: below the kernel's ephemeral range, where no outgoing
// connection takes them in between).
func freeAddrs(n int) ([]string, error) {
	return freeport.Addrs("127.0.0.1", n)
}

// spawn starts a detached process of this executable (its own session, so that it outlives
// `atoll up`), with its output in a log file.
func spawn(logPath string, env []string, args ...string) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	pid := cmd.Process.Pid
	go func() { _ = cmd.Wait() }() // reap it if it dies while `atoll up` runs
	return pid, nil
}

func newUpCmd() *cobra.Command {
	var (
		dir, machine string
		agents       int
		heads        int
		asJSON       bool
		insecure     bool
		timeout      time.Duration
		opts         upOptions
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start a local multi-process cluster (heads and agents) in a directory, and leave it running",
		Long: `up starts --heads head processes (the Paxos metadata log and the control plane) and --agents
agent processes of declared machines (--machine, simulated GPUs) on this machine, waits until
the heads have a leader and every agent has registered, and returns with the cluster running.
The directory holds the cluster's secret (token, mode 0600), its address, the processes' data
and logs. atoll down --dir stops it; atoll address --dir prints its address.

On a directory that holds a cluster already, up restarts what of it is not running (after a
crash, a reboot, a SIGKILL), with the addresses, data and options it had (its --machine, TLS
and pools; --agents may add agents), and returns once every agent has registered again from
its new process. Processes are known by their pid, start time and command line, so a pid
another process reuses is never taken for one of them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("up: --dir is required")
			}
			if opts.poolFile != "" {
				if _, err := pools.LoadFile(opts.poolFile); err != nil {
					return fmt.Errorf("up: %w", err)
				}
			}
			if err := checkTiming(opts.tick, opts.election); err != nil {
				return fmt.Errorf("up: %w", err)
			}
			cf, st, err := startCluster(cmd.Context(), dir, heads, agents, machine, !insecure, timeout, opts)
			if err != nil {
				return fmt.Errorf("up: %w", err)
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(cf)
			}
			abs, _ := filepath.Abs(dir)
			fmt.Fprintf(cmd.OutOrStdout(), "cluster up in %s: %d heads (leader %d), %d agents of %s\naddress: %s\n",
				abs, heads, st.Leader, agents, machine, cf.Address)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "the cluster's directory `DIR` (created with its secret if new)")
	f.IntVar(&agents, "agents", 4, "agent processes (one per declared machine)")
	f.IntVar(&heads, "heads", 3, "head processes (1, 3 or 5)")
	f.StringVar(&machine, "machine", "dgx-h100", "the machine each agent declares: a built-in machine or a spec file of one machine (simulated GPUs); discover: the agents discover this machine (an atoll built with -tags nvml, on a GPU machine)")
	f.BoolVar(&asJSON, "json", false, "print the cluster file as JSON")
	f.DurationVar(&timeout, "timeout", time.Minute, "how long to wait for the cluster to be ready")
	f.BoolVar(&insecure, "insecure-no-tls", false, "run every link on the token alone, in clear (default: mutual TLS with the cluster's CA)")
	f.StringVar(&opts.poolFile, "pools", "", "a pool file: the leader adds and removes agents with the work (local provider; docs/pools.md)")
	f.DurationVar(&opts.gossipProbe, "gossip-probe", 0, "the heads' and its agents' --gossip-probe (0: theirs, 500ms): "+gossipProbeUsage)
	timingFlags(f, &opts.tick, &opts.election)
	f.DurationVar(&opts.heartbeatTimeout, "heartbeat-timeout", 0, "the heads' --heartbeat-timeout (0: theirs, 10s): how long a machine may send no load report before it is declared dead")
	f.DurationVar(&opts.agent.reconcileInterval, "reconcile-interval", 0, "the agents' --reconcile-interval (0: their default)")
	f.Int64Var(&opts.agent.maxObjectSize, "max-object-size", 0, "the agents' --max-object-size (0: their default)")
	f.BoolVar(&opts.agent.trustedFabric, "trusted-fabric", false, "the agents' --trusted-fabric: collective links between worker processes without TLS, for a fabric that is trusted and isolated (never the default)")
	f.StringVar(&opts.agent.checkpointDir, "checkpoint-dir", "", "a shared checkpoint directory every agent mounts (their --checkpoint-dir): the second durable copy of checkpoints and detached objects goes there")
	return cmd
}

// startCluster starts a cluster of heads and agents as detached processes of this executable
// with their state in dir, or restarts the one in dir: what runs of it is kept (checked by
// its identity, not its pid alone), what does not is started again with the addresses,
// directories and options it had. It returns once the heads have a leader and every agent
// registered from the process that runs now (its machine's record names its pid and its new
// address). A pool file (opts.poolFile) makes the heads run the pools autoscaler with the
// local provider; a restart keeps the options the cluster was started with.
func startCluster(ctx context.Context, dir string, heads, agents int, machine string, secure bool, timeout time.Duration, opts upOptions) (*clusterFile, api.Status, error) {
	var st api.Status
	if agents < 0 || agents > 256 {
		return nil, st, fmt.Errorf("--agents %d: want 0..256", agents)
	}
	if heads != 1 && heads != 3 && heads != 5 {
		return nil, st, fmt.Errorf("--heads %d: want 1, 3 or 5", heads)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, st, err
	}
	pools := ""
	if opts.poolFile != "" {
		if pools, err = filepath.Abs(opts.poolFile); err != nil {
			return nil, st, err
		}
	}
	cf, err := readClusterFile(abs)
	if err != nil && !errors.Is(err, errNoCluster) {
		// A cluster's file that cannot be read is not a new cluster: starting one would
		// write over it and lose its heads' logs.
		return nil, st, fmt.Errorf("%w: fix or remove it to start a new cluster there", err)
	}
	if err == nil {
		if len(cf.Heads) != heads {
			return nil, st, fmt.Errorf("the cluster in %s has %d heads, not %d: atoll up restarts it as it was (atoll down --dir %s, and a new directory for another shape)",
				abs, len(cf.Heads), heads, dir)
		}
		if pools != "" && pools != cf.Pools {
			return nil, st, fmt.Errorf("the cluster in %s runs the pool file %q, not %q", abs, cf.Pools, pools)
		}
		if args := opts.agent.args(); len(args) > 0 && !slices.Equal(args, cf.AgentArgs) {
			return nil, st, fmt.Errorf("the cluster in %s runs its agents with %q, not %q", abs, cf.AgentArgs, args)
		}
		secure = cf.CACert != ""
		machine = cf.Machine
	} else {
		if _, _, err := machineSpec(ctx, declaredMachine(machine)); err != nil {
			return nil, st, err
		}
		if cf, err = newClusterFile(abs, heads, machine, secure, pools); err != nil {
			return nil, st, err
		}
		if opts.gossipProbe > 0 {
			cf.GossipProbe = opts.gossipProbe.String()
		}
		if opts.heartbeatTimeout > 0 {
			cf.HeartbeatTimeout = opts.heartbeatTimeout.String()
		}
		if opts.tick > 0 {
			cf.Tick = opts.tick.String()
		}
		if opts.election > 0 {
			cf.ElectionTimeout = opts.election.String()
		}
		if opts.reportRate != 0 {
			cf.ReportRate = strconv.FormatFloat(opts.reportRate, 'g', -1, 64)
		}
		if opts.handshakes > 0 {
			cf.MaxHandshakes = strconv.Itoa(opts.handshakes)
		}
		if opts.inflight > 0 {
			cf.MaxInflight = strconv.Itoa(opts.inflight)
		}
		cf.HTTP2 = opts.http2
		cf.AgentArgs = opts.agent.args()
	}
	for i := len(cf.Agents); i < agents; i++ {
		name := fmt.Sprintf("node-%d", i)
		cf.Agents = append(cf.Agents, procInfo{Name: name, Log: filepath.Join(abs, "logs", name+".log"), Dir: filepath.Join(abs, "agents", name)})
	}
	for _, d := range []string{"logs", "heads", "agents"} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o700); err != nil {
			return nil, st, err
		}
	}
	env := []string{"ATOLL_TOKEN_FILE=" + cf.TokenFile}
	var clientTLS *tls.Config
	if cf.CACert != "" {
		env = append(env, api.CACertEnv+"="+cf.CACert)
		// `up` itself is a client of the heads: it holds the CA, so it issues its own
		// certificate.
		ca, err := pki.LoadCA(filepath.Dir(cf.CACert))
		if err != nil {
			return nil, st, err
		}
		id, err := ca.IssueIdentity(fmt.Sprintf("cli/up/%d", os.Getpid()))
		if err != nil {
			return nil, st, err
		}
		clientTLS = id.Client()
	}
	var started []procInfo // by this call: stopped again if it fails
	fail := func(err error) (*clusterFile, api.Status, error) {
		stopProcs(&clusterFile{Agents: started}, 5*time.Second)
		return nil, st, err
	}
	start := func(p *procInfo, args []string, extra ...string) error {
		pid, err := spawn(p.Log, append(slices.Clone(env), extra...), args...)
		if err != nil {
			return fmt.Errorf("start %s: %w", p.Name, err)
		}
		p.PID, p.Start, p.Cmdline = pid, 0, nil
		err = p.identify()
		started = append(started, *p)
		return err
	}
	for i := range cf.Heads {
		h := &cf.Heads[i]
		if h.running() {
			continue
		}
		if err := addressesFree(h.Name, h.Paxos, strings.TrimPrefix(strings.TrimPrefix(h.API, "https://"), "http://"), h.Gossip); err != nil {
			return fail(err)
		}
		if err := start(h, headArgs(abs, cf, i)); err != nil {
			return fail(err)
		}
	}
	if err := writeClusterFile(abs, cf); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var urls []string
	for _, h := range cf.Heads {
		urls = append(urls, h.API)
	}
	client, err := api.NewClient(ctx, api.ClientConfig{Heads: urls, Token: mustToken(cf.TokenFile), TLS: clientTLS})
	if err == nil {
		_, err = waitStatus(ctx, client, func(api.Status) bool { return true })
	}
	if err != nil {
		return fail(fmt.Errorf("the heads did not elect a leader in %v (logs in %s): %w", timeout, filepath.Join(abs, "logs"), err))
	}
	for i := range cf.Agents {
		a := &cf.Agents[i]
		if a.running() {
			continue
		}
		args := []string{"agent", "--join", cf.Address, "--name", a.Name, "--dir", a.Dir}
		if m := declaredMachine(cf.Machine); m != "" {
			args = append(args, "--machine", m)
		}
		if cf.GossipProbe != "" {
			args = append(args, "--gossip-probe", cf.GossipProbe)
		}
		args = append(args, cf.AgentArgs...)
		cred, err := agentCredential(cf.TokenFile, a.Dir, a.Name)
		if err != nil {
			return fail(fmt.Errorf("agent %s: its credential: %w", a.Name, err))
		}
		// Its own credential, not the cluster token (an env entry later in the list wins).
		if err := start(a, args, "ATOLL_TOKEN_FILE="+cred); err != nil {
			return fail(err)
		}
	}
	if err := writeClusterFile(abs, cf); err != nil {
		return fail(err)
	}
	// Every agent registered from the process that runs now: the log may still hold a
	// machine's record of an earlier process (alive, with its old address).
	st, err = waitStatus(ctx, client, func(st api.Status) bool {
		for _, a := range cf.Agents {
			i := slices.IndexFunc(st.Machines, func(m api.MachineStatus) bool { return m.Name == a.Name })
			if i < 0 || !st.Machines[i].Alive || st.Machines[i].PID != a.PID || st.Machines[i].Agent == "" {
				return false
			}
		}
		return true
	})
	if err != nil {
		return fail(fmt.Errorf("the agents did not register in %v (logs in %s): %w", timeout, filepath.Join(abs, "logs"), err))
	}
	for i := range cf.Agents {
		for _, m := range st.Machines {
			if m.Name == cf.Agents[i].Name {
				cf.Agents[i].API = m.Agent
			}
		}
	}
	return cf, st, writeClusterFile(abs, cf)
}

// newClusterFile prepares a new cluster in dir: its secret and CA, and addresses for its
// heads (nothing is started).
// machineDiscover is atoll up's --machine that makes agents discover this machine.
const machineDiscover = "discover"

// declaredMachine is the --machine an agent of atoll up's is given: "" to discover.
func declaredMachine(machine string) string {
	if machine == machineDiscover {
		return ""
	}
	return machine
}

func newClusterFile(abs string, heads int, machine string, secure bool, pools string) (*clusterFile, error) {
	tf, caDir, err := initDir(abs)
	if err != nil {
		return nil, err
	}
	addrs, err := freeAddrs(3 * heads)
	if err != nil {
		return nil, err
	}
	cf := &clusterFile{TokenFile: tf, Machine: machine, Started: time.Now(), Pools: pools}
	scheme := "http://"
	if secure {
		scheme = "https://"
		cf.CACert = filepath.Join(caDir, pki.CACertFile)
	}
	var urls []string
	for i := 0; i < heads; i++ {
		id := i + 1
		urls = append(urls, scheme+addrs[heads+i])
		cf.Heads = append(cf.Heads, procInfo{ID: uint64(id), Name: fmt.Sprintf("head-%d", id), API: urls[i], Paxos: addrs[i], Gossip: addrs[2*heads+i],
			Log: filepath.Join(abs, "logs", fmt.Sprintf("head-%d.log", id)), Dir: filepath.Join(abs, "heads", strconv.Itoa(id))})
	}
	cf.Address = api.FormatAddress(urls)
	return cf, nil
}

// headArgs is the command line of head i of a cluster.
func headArgs(abs string, cf *clusterFile, i int) []string {
	var peers, others []string
	for j, h := range cf.Heads {
		peers = append(peers, fmt.Sprintf("%d=%s", h.ID, h.Paxos))
		if j != i {
			others = append(others, h.Gossip)
		}
	}
	h := cf.Heads[i]
	args := []string{"head", "--id", strconv.FormatUint(h.ID, 10), "--peers", strings.Join(peers, ","),
		"--client-listen", strings.TrimPrefix(strings.TrimPrefix(h.API, "https://"), "http://"), "--data-dir", h.Dir,
		"--gossip", h.Gossip, "--gossip-join", strings.Join(others, ",")}
	if cf.CACert != "" {
		args = append(args, "--ca-dir", filepath.Dir(cf.CACert))
	} else {
		args = append(args, "--insecure-no-tls")
	}
	if cf.Pools != "" {
		args = append(args, poolHeadArgs(cf.Pools, abs, cf.Address)...)
	}
	if cf.GossipProbe != "" {
		args = append(args, "--gossip-probe", cf.GossipProbe)
	}
	if cf.HeartbeatTimeout != "" {
		args = append(args, "--heartbeat-timeout", cf.HeartbeatTimeout)
	}
	if cf.Tick != "" {
		args = append(args, "--tick", cf.Tick)
	}
	if cf.ElectionTimeout != "" {
		args = append(args, "--election-timeout", cf.ElectionTimeout)
	}
	if cf.ReportRate != "" {
		args = append(args, "--report-rate", cf.ReportRate)
	}
	if cf.MaxHandshakes != "" {
		args = append(args, "--max-handshakes", cf.MaxHandshakes)
	}
	if cf.MaxInflight != "" {
		args = append(args, "--max-inflight", cf.MaxInflight)
	}
	if cf.HTTP2 {
		args = append(args, "--http2")
	}
	return args
}

// addressesFree checks that a process about to be started again can listen where it did.
func addressesFree(name string, addrs ...string) error {
	for _, a := range addrs {
		if a == "" {
			continue
		}
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return fmt.Errorf("%s cannot start again: its address %s is taken by another process (free it, or atoll down and start a new directory): %w", name, a, err)
		}
		ln.Close()
	}
	return nil
}

func mustToken(path string) string {
	t, err := sdk.ReadTokenFile(path)
	if err != nil {
		return ""
	}
	return string(t)
}

func writeClusterFile(dir string, cf *clusterFile) error {
	b, err := json.MarshalIndent(cf, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, clusterFileName+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, clusterFileName))
}

// waitStatus polls the leader's status until ok holds or ctx ends.
func waitStatus(ctx context.Context, c *api.Client, ok func(api.Status) bool) (api.Status, error) {
	var last error
	for {
		st, err := c.Status(ctx)
		if err == nil && ok(st) {
			return st, nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last == nil {
				last = ctx.Err()
			}
			return st, last
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stopProcs stops the agents, then the heads: SIGTERM, then SIGKILL after grace. Only the
// processes the records identify are signalled (procInfo.running): a pid now held by
// another process is left alone.
func stopProcs(cf *clusterFile, grace time.Duration) []string {
	var notes []string
	for _, group := range [][]procInfo{cf.Agents, cf.Heads} {
		for _, p := range group {
			p.signal(syscall.SIGTERM)
		}
		deadline := time.Now().Add(grace)
		for _, p := range group {
			for p.running() && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if p.signal(syscall.SIGKILL) {
				notes = append(notes, fmt.Sprintf("%s (pid %d) killed after %v", p.Name, p.PID, grace))
				for end := time.Now().Add(2 * time.Second); p.running() && time.Now().Before(end); {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}
	}
	return notes
}

func newDownCmd() *cobra.Command {
	var dir string
	var grace time.Duration
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop every process `atoll up` started in a directory",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("down: --dir is required")
			}
			abs, err := filepath.Abs(dir)
			if err != nil {
				return fmt.Errorf("down: %w", err)
			}
			cf, err := readClusterFile(abs)
			if err != nil {
				return fmt.Errorf("down: %w", err)
			}
			// A pool's agent may be named by the pid files of several heads (each leader
			// launches and records): each process is counted once.
			for _, p := range poolAgents(abs) {
				if !slices.ContainsFunc(cf.Agents, func(a procInfo) bool { return a.PID == p.PID }) {
					cf.Agents = append(cf.Agents, p)
				}
			}
			var ours []procInfo
			for _, p := range append(slices.Clone(cf.Heads), cf.Agents...) {
				if p.running() {
					ours = append(ours, p)
				} else if p.PID > 0 && alive(p.PID) {
					fmt.Fprintf(cmd.ErrOrStderr(), "down: %s is not running: its pid %d is another process now, left alone\n", p.Name, p.PID)
				}
			}
			if len(ours) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "nothing to stop: no process of the cluster in %s runs; the directory keeps the data and logs\n", dir)
				return nil
			}
			for _, n := range stopProcs(cf, grace) {
				fmt.Fprintln(cmd.ErrOrStderr(), "down:", n)
			}
			var names []string
			for _, p := range ours {
				if p.running() {
					return fmt.Errorf("down: %s (pid %d) is still running", p.Name, p.PID)
				}
				names = append(names, p.Name)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "stopped %d processes (%s); the directory %s keeps the data and logs\n", len(ours), strings.Join(names, ", "), dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the cluster's directory `DIR`")
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "how long each process has to stop before it is killed")
	return cmd
}

func newAddressCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "address",
		Short: "Print a cluster's address (for ATOLL_ADDRESS): its heads' URLs and its token file",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("address: --dir is required")
			}
			addr, _, err := clusterAddress(dir, "")
			if err != nil {
				return fmt.Errorf("address: %w", err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), addr)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the cluster's directory `DIR`")
	return cmd
}

func newStatusCmd() *cobra.Command {
	var dir, address string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show a cluster: its heads (and leader), machines and gangs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			addr, cf, err := clusterAddress(dir, address)
			if err != nil {
				return fmt.Errorf("status: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 15*time.Second)
			defer cancel()
			c, err := dialCluster(ctx, addr)
			if err != nil {
				return fmt.Errorf("status: %w", err)
			}
			st, err := c.Status(ctx)
			if err != nil {
				return fmt.Errorf("status: %w", err)
			}
			st.Heads = headsOf(ctx, c, st.Leader)
			if kvs, err := c.Meta().Range(ctx, api.TableObjects); err == nil {
				os := objects.Count(kvs)
				st.Objects = &os
			}
			if cf != nil {
				for i := range st.Heads {
					for _, h := range cf.Heads {
						if h.API == st.Heads[i].Address {
							st.Heads[i].PID = h.PID
						}
					}
				}
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(st)
			}
			printStatus(cmd.OutOrStdout(), st)
			printPools(cmd.OutOrStdout(), st.Pools)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	f.BoolVar(&asJSON, "json", false, "print JSON: leader, heads, machines, gangs, queues, services")
	return cmd
}

// headsOf asks every head for its id, role and storage state (a head whose disk filled
// says so: it has stepped down, and rejoins by itself when space frees).
func headsOf(ctx context.Context, c *dialed, leader uint64) []api.HeadInfo {
	var out []api.HeadInfo
	for _, u := range c.Heads() {
		h := api.HeadInfo{Address: u}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, u+"/v1/status", nil)
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := c.hc.Do(req)
		if err == nil {
			var st struct {
				ID       uint64 `json:"id"`
				DiskFull bool   `json:"disk_full"`
				Error    string `json:"error"`
			}
			// The body is read before the request's context ends: over HTTP/2 its end
			// resets the stream, and the answer was lost.
			_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st)
			resp.Body.Close()
			h.ID, h.DiskFull, h.Error = st.ID, st.DiskFull, st.Error
		}
		cancel()
		h.Leader = h.ID != 0 && h.ID == leader
		out = append(out, h)
	}
	return out
}

func printStatus(w io.Writer, st api.Status) {
	fmt.Fprintf(w, "leader: head %d\n", st.Leader)
	fmt.Fprintf(w, "term: %d\n", st.Term)
	if st.Dashboard != "" {
		fmt.Fprintf(w, "dashboard: %s\n", st.Dashboard)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HEAD\tADDRESS\tPID\tROLE")
	for _, h := range st.Heads {
		role, id := "follower", strconv.FormatUint(h.ID, 10)
		if h.Leader {
			role = "leader"
		}
		switch {
		case h.ID == 0:
			role, id = "unreachable", "?"
		case h.DiskFull:
			role = "disk full (stepped down; rejoins when space frees)"
		case h.Error != "":
			role = "stopped: its storage failed"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", id, h.Address, pidText(h.PID), role)
	}
	for _, h := range st.Heads {
		if h.Error != "" {
			fmt.Fprintf(tw, "head %d: %s\n", h.ID, h.Error)
		}
	}
	fmt.Fprintln(tw, "\nMACHINE\tGPUS\tFREE\tALIVE\tPID\tGPU KIND\tLOAD (cpu/mem)")
	for _, m := range st.Machines {
		kind := "real"
		if m.Simulated {
			kind = "simulated"
		}
		load := "-"
		if m.Load != nil {
			load = fmt.Sprintf("%.0f%%/%.0f%%", 100*m.Load.CPU, 100*m.Load.Mem)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%v\t%s\t%s\t%s\n", m.Name, m.GPUs, m.FreeGPUs, m.Alive, pidText(m.PID), kind, load)
	}
	for _, m := range st.Machines {
		if !m.Cordoned {
			continue
		}
		what := "cordoned"
		if m.Drained {
			what = "drained"
		}
		fmt.Fprintf(tw, "  %s is %s by %s since %s: %s (atoll undrain %s lifts it)\n", m.Name, what, m.CordonedBy,
			m.CordonedAt.Local().Format(time.DateTime), m.CordonReason, m.Name)
	}
	fmt.Fprintln(tw, "\nGANG\tSTATE\tQUEUE\tREADY\tGEN\tRESTARTS\tMACHINES\tREASON")
	for _, g := range st.Gangs {
		fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%d/%d\t%d\t%d\t%s\t%s\n", g.Job, g.Name, g.State, queueName(g.Queue), g.Ready, g.Workers, g.Generation, g.Restarts,
			strings.Join(g.Machines, ","), g.Reason)
	}
	printQueues(tw, st)
	if len(st.Services) > 0 {
		fmt.Fprintln(tw, "\nSERVICE\tREPLICAS (ready/decided, min..max)\tIN FLIGHT\tLATENCY (SLO)\tGPUS\tLAST DECISION")
		for _, s := range st.Services {
			slo := "-"
			if s.LatencySLOMS > 0 {
				slo = fmt.Sprintf("%.0f ms", s.LatencySLOMS)
			}
			fmt.Fprintf(tw, "%s/%s\t%d/%d, %d..%d\t%d\t%.1f ms (%s)\t%d\t%s\n", s.Job, s.Name, s.Ready, s.Replicas, s.MinReplicas, s.MaxReplicas,
				s.InFlight, s.LatencyMS, slo, s.GPUs, s.Reason)
		}
	}
	_ = tw.Flush()
	if o := st.Objects; o != nil {
		fmt.Fprintf(w, "\nobjects: %d live (%d durable, %d bytes), %d lost, %d whose owner ended\n", o.Live, o.Durable, o.LiveBytes, o.Lost, o.OwnerDied)
	}
}

func pidText(pid int) string {
	if pid == 0 {
		return "-"
	}
	return strconv.Itoa(pid)
}

func newKillWorkerCmd() *cobra.Command {
	var dir, address, gang string
	var rank int
	cmd := &cobra.Command{
		Use:   "kill-worker JOB",
		Short: "SIGKILL one worker process of a job, as a crash would (a failure drill: its gang restarts from its checkpoint)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			job := args[0]
			if err := api.CheckName("job", job); err != nil {
				return fmt.Errorf("kill-worker: %w", err)
			}
			addr, _, err := clusterAddress(dir, address)
			if err != nil {
				return fmt.Errorf("kill-worker: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			c, err := dialCluster(ctx, addr)
			if err != nil {
				return fmt.Errorf("kill-worker: %w", err)
			}
			if gang, err = jobGang(ctx, c.Client, job, gang); err != nil {
				return fmt.Errorf("kill-worker: %w", err)
			}
			g, _, err := c.Gang(ctx, job, gang)
			if err != nil {
				return fmt.Errorf("kill-worker: %w", err)
			}
			if g.Placement == nil || rank < 0 || rank >= len(g.Placement.Members) {
				return fmt.Errorf("kill-worker: gang %s/%s has no placed rank %d (it is %s)", job, gang, rank, g.State)
			}
			var m api.Machine
			if ok, err := c.Get(ctx, api.TableMachines+g.Placement.Members[rank].Machine, &m); err != nil || !ok {
				return fmt.Errorf("kill-worker: machine of rank %d: %v", rank, err)
			}
			q := url.Values{"job": {job}, "gang": {gang}, "rank": {strconv.Itoa(rank)}}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, m.Agent.API+"/v1/workers/kill?"+q.Encode(), nil)
			req.Header.Set("Authorization", "Bearer "+c.token)
			resp, err := c.hc.Do(req)
			if err != nil {
				return fmt.Errorf("kill-worker: agent of %s: %w", m.Name, err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("kill-worker: agent of %s: %s", m.Name, strings.TrimSpace(string(b)))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "killed rank %d of %s/%s on %s: %s", rank, job, gang, m.Name, b)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	f.StringVar(&gang, "gang", "", "the gang (default: the job's only gang)")
	f.IntVar(&rank, "rank", 0, "the worker's rank")
	return cmd
}

// agentCredentialFile is the name, in an agent's directory, of the credential `up` gives it.
const agentCredentialFile = "credential"

// agentCredential returns the file of the credential of an agent `up` starts (made once,
// mode 0600, in its directory): a scoped token of agent/<name>, so that the agent holds
// no cluster secret and can do only what that machine's agent does (docs/hardening.md).
func agentCredential(clusterTokenFile, agentDir, name string) (string, error) {
	path := filepath.Join(agentDir, agentCredentialFile)
	if b, err := sdk.ReadTokenFile(path); err == nil {
		if _, p, err := authz.ParseToken([]byte(mustToken(clusterTokenFile)), string(b)); err == nil && p == authz.Agent(name) {
			return path, nil
		}
	}
	secret, err := sdk.ReadTokenFile(clusterTokenFile)
	if err != nil {
		return "", err
	}
	tok, _, err := authz.NewToken(secret, authz.Claims{Principal: authz.Agent(name).String()})
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(agentDir, 0o700); err != nil {
		return "", err
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(tok+"\n"), 0o600); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}
