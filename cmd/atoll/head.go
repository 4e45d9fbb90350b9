package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/meta"
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

// newHeadCmd is `atoll head`: run one metadata replica (Paxos + meta state machine).
func newHeadCmd() *cobra.Command {
	var (
		id           uint64
		listen       string
		peersFlag    string
		clientListen string
		dataDir      string
		token        string
		noFsync      bool
		tick         time.Duration
		join         bool
		initialFlag  string
	)
	cmd := &cobra.Command{
		Use:   "head",
		Short: "Run one head replica: a Paxos metadata log replica with its client API",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if token == "" {
				token = os.Getenv("ATOLL_TOKEN")
			}
			if token == "" {
				return errors.New("head: no cluster token: pass --token or set ATOLL_TOKEN")
			}
			if dataDir == "" {
				return errors.New("head: --data-dir is required")
			}
			peers, err := parsePeers(peersFlag)
			if err != nil {
				return fmt.Errorf("head: %w", err)
			}
			if listen == "" {
				listen = peers[id]
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
			tr, err := paxos.NewTCPTransport(paxos.TCPConfig{ID: id, Listen: listen, Peers: peers, Token: []byte(token), Logger: logger})
			if err != nil {
				return fmt.Errorf("head: %w", err)
			}
			defer tr.Close()
			w, err := paxos.OpenWAL(dataDir, paxos.WALOptions{NoSync: noFsync, Logger: logger})
			if err != nil {
				return fmt.Errorf("head: %w", err)
			}
			rc := paxos.DefaultReplicaConfig(id, ids)
			rc.Node.Join = join
			rc.TickInterval = tick
			rc.Logger = logger
			sm := meta.NewStateMachine(0)
			rep, err := paxos.StartReplica(rc, w, tr, sm)
			if err != nil {
				w.Close()
				return fmt.Errorf("head: %w", err)
			}
			defer rep.Close()
			ln, err := net.Listen("tcp", clientListen)
			if err != nil {
				return fmt.Errorf("head: client API listen %s: %w", clientListen, err)
			}
			srv := &http.Server{Handler: &meta.Handler{Replica: rep, SM: sm, Token: token, Logger: logger}, ReadHeaderTimeout: 5 * time.Second}
			go srv.Serve(ln)
			fmt.Fprintf(cmd.OutOrStdout(), "client-api http://%s\n", ln.Addr())
			logger.Info("head replica running", zap.Uint64("id", id), zap.String("listen", tr.Addr().String()),
				zap.String("client_api", ln.Addr().String()), zap.String("data_dir", dataDir), zap.Bool("fsync", !noFsync))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		},
	}
	f := cmd.Flags()
	f.Uint64Var(&id, "id", 0, "this replica's id (1..65535), one of --peers")
	f.StringVar(&listen, "listen", "", "address for replica-to-replica traffic (default: this id's --peers address)")
	f.StringVar(&peersFlag, "peers", "", "every replica as id=host:port,... (this one included)")
	f.StringVar(&clientListen, "client-listen", "127.0.0.1:0", "address of the HTTP client API")
	f.StringVar(&dataDir, "data-dir", "", "directory of this replica's WAL")
	f.StringVar(&token, "token", "", "cluster token (default $ATOLL_TOKEN)")
	f.BoolVar(&noFsync, "no-fsync", false, "do not fsync the WAL (unsafe: acknowledged writes may be lost on power loss)")
	f.DurationVar(&tick, "tick", 10*time.Millisecond, "Paxos tick (election timeout is 10-20 ticks)")
	f.BoolVar(&join, "join", false, "this replica is being added to a running group (POST /v1/members/add at the leader): it learns the log and votes once a configuration including it is chosen; always restart it with --join")
	f.StringVar(&initialFlag, "initial-members", "", "ids of the group's first configuration, comma-separated (default: every id in --peers); keep it the same across restarts")
	return cmd
}
