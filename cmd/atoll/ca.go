package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
)

// caSettle is how long a rotation step waits, by default, before the next may follow:
// every process asks the heads for the cluster's CAs every api.TrustPoll, and the heads
// read their CA directory every 2 s; twice the one plus the other covers a missed round.
const caSettle = 2*api.TrustPoll + 2*time.Second

// caHead is one head's view of the cluster CA (GET /v1/trust), for atoll ca.
type caHead struct {
	Address string          `json:"address"`
	Phase   string          `json:"phase,omitempty"`
	Signing string          `json:"signing,omitempty"` // the signing CA's subject
	Trusts  []string        `json:"trusts"`            // the subjects of the CAs trusted
	Stale   []api.StaleCert `json:"stale"`
	Error   string          `json:"error,omitempty"`
}

// caStatus is atoll ca status's answer.
type caStatus struct {
	CADir string   `json:"ca_dir,omitempty"`
	Phase string   `json:"phase,omitempty"` // the CA directory's
	Heads []caHead `json:"heads"`
}

func newCACmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ca",
		Short: "Show the cluster CA, or rotate it without stopping the cluster",
		Long: `ca shows the cluster's certificate authority as each head follows it (ca status), and
rotates it while the cluster runs (ca rotate), in three steps:

  atoll ca rotate --dir D              add: a new CA, trusted beside the old one
  atoll ca rotate --dir D --activate   the new CA signs; every process renews its certificate
  atoll ca rotate --dir D --finish     the old CA is trusted no more

Heads reread their CA directory every 2 s; agents, drivers and workers ask the heads every
5 s, trust what they trust and renew their own certificate with their own credential. Each
step waits for every head to follow it; the next is refused until the processes have had
time to follow too (--settle), and --finish until no head has seen, within a minute, a
caller with a certificate of the old CA (ca status lists them). Credential directories
made before the rotation (atoll token create) hold the old CA's certificates: make them
again after --finish. Connections opened before --finish keep going; new ones need the new
CA's certificates.`,
	}
	cmd.AddCommand(newCAStatusCmd(), newCARotateCmd())
	return cmd
}

// caTarget resolves atoll ca's flags: the CA directory (--ca-dir, or the cluster
// directory's tls/) and the heads' address, if a cluster runs.
func caTarget(dir, address, caDir string) (string, string, error) {
	if caDir == "" && dir != "" {
		caDir = filepath.Join(dir, "tls")
	}
	addr, _, err := clusterAddress(dir, address)
	if errors.Is(err, errNoCluster) {
		return caDir, "", nil // the files alone: the heads follow when they start
	}
	return caDir, addr, err
}

// caHeads asks every head for its view of the cluster CA.
func caHeads(ctx context.Context, addr string) ([]caHead, error) {
	d, err := dialCluster(ctx, addr)
	if err != nil {
		return nil, err
	}
	var out []caHead
	for _, h := range d.Heads() {
		ch := caHead{Address: h, Trusts: []string{}, Stale: []api.StaleCert{}}
		ti, err := headTrust(ctx, d, h)
		if err != nil {
			ch.Error = err.Error()
			out = append(out, ch)
			continue
		}
		ch.Phase, ch.Stale = ti.Phase, ti.Stale
		if s := subjects([]byte(ti.Signing)); len(s) > 0 {
			ch.Signing = s[0]
		}
		ch.Trusts = subjects([]byte(ti.Bundle))
		out = append(out, ch)
	}
	return out, nil
}

// headTrust asks one head (not the leader: each reads its own CA directory).
func headTrust(ctx context.Context, d *dialed, head string) (api.TrustInfo, error) {
	var ti api.TrustInfo
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, strings.TrimRight(head, "/")+"/v1/trust", nil)
	if err != nil {
		return ti, err
	}
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := d.hc.Do(req)
	if err != nil {
		return ti, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return ti, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return ti, json.Unmarshal(b, &ti)
}

// subjects names the certificates of a PEM bundle.
func subjects(bundle []byte) []string {
	out := []string{}
	for _, c := range pki.ParseBundle(bundle) {
		serial := c.SerialNumber.Bytes()
		out = append(out, fmt.Sprintf("%s (serial %x…)", c.Subject.CommonName, serial[:min(4, len(serial))]))
	}
	return out
}

func newCAStatusCmd() *cobra.Command {
	var dir, address, caDir string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the CA directory's rotation phase and each head's: the CA that signs, those trusted, callers not yet renewed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			caDir, addr, err := caTarget(dir, address, caDir)
			if err != nil {
				return fmt.Errorf("ca status: %w", err)
			}
			st := caStatus{CADir: caDir, Heads: []caHead{}}
			if caDir != "" {
				if st.Phase, err = pki.RotationPhase(caDir); err != nil {
					return fmt.Errorf("ca status: %w", err)
				}
			}
			if addr != "" {
				ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
				defer cancel()
				if st.Heads, err = caHeads(ctx, addr); err != nil {
					return fmt.Errorf("ca status: %w", err)
				}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(st)
			}
			if caDir != "" {
				fmt.Fprintf(out, "CA directory %s: phase %s\n", caDir, st.Phase)
			}
			if addr == "" {
				fmt.Fprintln(out, "no cluster runs: no head to ask")
			}
			for _, h := range st.Heads {
				if h.Error != "" {
					fmt.Fprintf(out, "head %s: %s\n", h.Address, h.Error)
					continue
				}
				fmt.Fprintf(out, "head %s: phase %s, signs with %s, trusts %s\n", h.Address, h.Phase, h.Signing, strings.Join(h.Trusts, ", "))
				for _, s := range h.Stale {
					fmt.Fprintf(out, "  not renewed yet: %s (%s), seen %s\n", s.Name, s.Principal, s.LastSeen.Format(time.TimeOnly))
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	f.StringVar(&caDir, "ca-dir", "", "the cluster CA's `DIR` (default: the cluster directory's tls/)")
	f.BoolVar(&asJSON, "json", false, `print {"ca_dir", "phase", "heads": [{"address", "phase", "signing", "trusts", "stale"}]} as JSON`)
	return cmd
}

func newCARotateCmd() *cobra.Command {
	var dir, address, caDir string
	var activate, finish, force bool
	settle := caSettle
	cmd := &cobra.Command{
		Use:   "rotate",
		Short: "Rotate the cluster CA without downtime: add a new CA, then --activate it, then --finish",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if activate && finish {
				return errors.New("ca rotate: --activate and --finish are two steps: give one")
			}
			caDir, addr, err := caTarget(dir, address, caDir)
			if err != nil {
				return fmt.Errorf("ca rotate: %w", err)
			}
			if caDir == "" {
				return errors.New("ca rotate: which CA? give --dir DIR (of atoll up) or --ca-dir DIR (the heads' --ca-dir)")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			out := cmd.OutOrStdout()
			phase, err := pki.RotationPhase(caDir)
			if err != nil {
				return fmt.Errorf("ca rotate: %w", err)
			}
			// since is how long the directory has been in its phase.
			since := func(file string) time.Duration {
				st, err := os.Stat(filepath.Join(caDir, file))
				if err != nil {
					return settle
				}
				return time.Since(st.ModTime())
			}
			var want string
			switch {
			case activate:
				if phase != pki.PhaseAdded {
					return fmt.Errorf("ca rotate --activate: %s is in phase %s: the new CA is added first (atoll ca rotate without --activate)", caDir, phase)
				}
				if d := since(pki.NextCertFile); d < settle && !force {
					return fmt.Errorf("ca rotate --activate: the new CA was added %s ago: processes may not trust it yet; run it again in %s (or --force)", d.Round(time.Second), (settle - d).Round(time.Second))
				}
				if _, err := pki.RotateActivate(caDir); err != nil {
					return fmt.Errorf("ca rotate --activate: %w", err)
				}
				want = pki.PhaseActivated
			case finish:
				if phase != pki.PhaseActivated {
					return fmt.Errorf("ca rotate --finish: %s is in phase %s, not activated", caDir, phase)
				}
				if d := since(pki.CACertFile); d < settle && !force {
					return fmt.Errorf("ca rotate --finish: the new CA was activated %s ago: processes may not have renewed yet; run it again in %s (or --force)", d.Round(time.Second), (settle - d).Round(time.Second))
				}
				if addr != "" && !force {
					heads, err := caHeads(ctx, addr)
					if err != nil {
						return fmt.Errorf("ca rotate --finish: %w", err)
					}
					var stale []string
					for _, h := range heads {
						for _, s := range h.Stale {
							stale = append(stale, fmt.Sprintf("%s (%s, seen by %s at %s)", s.Name, s.Principal, h.Address, s.LastSeen.Format(time.TimeOnly)))
						}
					}
					if len(stale) > 0 {
						return fmt.Errorf("ca rotate --finish: %d callers still present certificates of the old CA: %s; they would be refused after --finish (wait, or --force)", len(stale), strings.Join(stale, "; "))
					}
				}
				if err := pki.RotateFinish(caDir); err != nil {
					return fmt.Errorf("ca rotate --finish: %w", err)
				}
				want = pki.PhaseSteady
			default:
				if _, err := pki.RotateAdd(caDir); err != nil {
					return fmt.Errorf("ca rotate: %w", err)
				}
				want = pki.PhaseAdded
			}
			fmt.Fprintf(out, "%s: phase %s\n", caDir, want)
			if addr == "" {
				fmt.Fprintln(out, "no cluster runs: its heads follow when they start")
				return nil
			}
			// Every head follows the directory within its reload period.
			for {
				heads, err := caHeads(ctx, addr)
				if err != nil {
					return fmt.Errorf("ca rotate: %w", err)
				}
				behind := []string{}
				for _, h := range heads {
					if h.Phase != want {
						behind = append(behind, fmt.Sprintf("%s (%s%s)", h.Address, h.Phase, h.Error))
					}
				}
				if len(behind) == 0 {
					break
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("ca rotate: the heads %s did not follow the CA directory (is it the one they were started with, --ca-dir?)", strings.Join(behind, ", "))
				case <-time.After(500 * time.Millisecond):
				}
			}
			switch want {
			case pki.PhaseAdded:
				fmt.Fprintf(out, "every head trusts the new CA; processes follow within %s: then atoll ca rotate --activate\n", api.TrustPoll)
			case pki.PhaseActivated:
				fmt.Fprintf(out, "every head signs with the new CA; processes renew within %s (atoll ca status lists those that have not): then atoll ca rotate --finish\n", api.TrustPoll)
			default:
				fmt.Fprintln(out, "the old CA is retired: credential directories made before the rotation (atoll token create) must be made again")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	f.StringVar(&caDir, "ca-dir", "", "the cluster CA's `DIR`, as the heads were given it (default: the cluster directory's tls/)")
	f.BoolVar(&activate, "activate", false, "second step: the new CA signs, every process renews its certificate")
	f.BoolVar(&finish, "finish", false, "third step: the old CA is trusted no more")
	f.BoolVar(&force, "force", false, "take the step without waiting for processes to follow the last one")
	f.DurationVar(&settle, "settle", caSettle, "how long processes get to follow a step before the next may be taken")
	return cmd
}
