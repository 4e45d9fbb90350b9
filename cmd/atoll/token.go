package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/sdk"
)

// Credential files `atoll token create` writes, each mode 0600 in a 0700 directory.
const (
	credTokenFile = "token"
	credCertFile  = "client.crt"
	credKeyFile   = "client.key"
	credCAFile    = "ca.crt"
)

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Make and revoke scoped credentials: a driver of one job, an agent of one machine",
		Long: `token makes credentials narrower than the cluster token (which is admin): a process holding one
may do only what its role does on its own scope (docs/hardening.md has the table of role ×
action). A driver's credential acts within its job: it submits and stops that job, spawns and
stops its gangs, and reads and frees that job's objects; raw log writes, membership,
configuration and other jobs are refused (403, naming the role and the action), and every
refusal is an event (atoll events).`,
		Args: noSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newTokenCreateCmd(), newTokenRevokeCmd(), newTokenRevokedCmd())
	return cmd
}

// clusterSecrets reads a cluster directory's token and CA (as atoll init made them).
func clusterSecrets(dir string) ([]byte, *pki.CA, error) {
	if dir == "" {
		return nil, nil, errors.New("--dir is required: the cluster directory holds the token and the CA that sign credentials")
	}
	token, err := sdk.ReadTokenFile(filepath.Join(dir, tokenFileName))
	if err != nil {
		return nil, nil, err
	}
	ca, err := pki.LoadCA(filepath.Join(dir, "tls"))
	if err != nil {
		return nil, nil, err
	}
	return token, ca, nil
}

// credentialPrincipal is the principal of the flags of token create.
func credentialPrincipal(role, job, gang, machine string, rank int) (authz.Principal, error) {
	var p authz.Principal
	switch authz.Role(role) {
	case authz.RoleDriver:
		if gang != "" || machine != "" {
			return p, errors.New("a driver's credential names --job only")
		}
		p = authz.Driver(job)
	case authz.RoleAgent:
		if job != "" || gang != "" {
			return p, errors.New("an agent's credential names --machine only")
		}
		p = authz.Agent(machine)
	case authz.RoleWorker:
		if machine != "" {
			return p, errors.New("a worker's credential names --job, --gang and --rank")
		}
		p = authz.Worker(job, gang, rank)
	default:
		return p, fmt.Errorf("--role %q: want driver, agent or worker (admin is the cluster token; heads hold the CA)", role)
	}
	return authz.ParsePrincipal(p.String()) // checks the names
}

func newTokenCreateCmd() *cobra.Command {
	var dir, role, job, gang, machine, out string
	var rank int
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Write a scoped credential (token, client.crt, client.key, ca.crt; mode 0600) into --out",
		Long: `create makes a credential for one principal and writes it into the directory --out (made 0700):
token (a scoped token, signed with the cluster token), client.crt and client.key (a certificate
of the cluster CA that names the principal and ends with the token), and ca.crt; every file has
mode 0600. It needs the cluster directory (--dir, of atoll init or atoll up), not a running
cluster. A driver connects with it by the address option ;credentials=DIR, or
ATOLL_TOKEN_FILE=DIR/token and ATOLL_CA_CERT=DIR/ca.crt. atoll token revoke ends it before
--ttl does.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return errors.New("token create: --out DIR is required")
			}
			if ttl <= 0 {
				return fmt.Errorf("token create: --ttl %v: want a positive duration (a credential expires)", ttl)
			}
			p, err := credentialPrincipal(role, job, gang, machine, rank)
			if err != nil {
				return fmt.Errorf("token create: %w", err)
			}
			secret, ca, err := clusterSecrets(dir)
			if err != nil {
				return fmt.Errorf("token create: %w", err)
			}
			expires := time.Now().Add(ttl).Truncate(time.Second)
			tok, claims, err := authz.NewToken(secret, authz.Claims{Principal: p.String(), Expires: expires.Unix()})
			if err != nil {
				return fmt.Errorf("token create: %w", err)
			}
			certPEM, keyPEM, err := ca.IssueGrant(p.String(), pki.Grant{URI: authz.Grant(p, claims.ID, false), NotAfter: expires}, "localhost", "127.0.0.1")
			if err != nil {
				return fmt.Errorf("token create: %w", err)
			}
			if err := writeCredential(out, map[string][]byte{credTokenFile: []byte(tok + "\n"), credCertFile: certPEM, credKeyFile: keyPEM, credCAFile: ca.TrustPEM()}); err != nil {
				return fmt.Errorf("token create: %w", err)
			}
			abs, _ := filepath.Abs(out)
			fmt.Fprintf(cmd.OutOrStdout(), "credential %s for %s, until %s, in %s\nconnect with the address option ;credentials=%s\nrevoke with: atoll token revoke --dir %s %s\n",
				claims.ID, p, expires.UTC().Format(time.RFC3339), abs, abs, dir, claims.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "the cluster directory `DIR` (of atoll init or atoll up): its token and CA sign the credential")
	f.StringVar(&role, "role", "driver", "the credential's role: driver, agent or worker")
	f.StringVar(&job, "job", "", "the job of a driver or a worker")
	f.StringVar(&gang, "gang", "", "the gang of a worker")
	f.IntVar(&rank, "rank", 0, "the rank of a worker")
	f.StringVar(&machine, "machine", "", "the machine of an agent")
	f.DurationVar(&ttl, "ttl", 24*time.Hour, "how long the credential lasts")
	f.StringVar(&out, "out", "", "the directory to write the credential into (made 0700; its files 0600)")
	return cmd
}

// writeCredential writes the files of a credential into dir (0700), each 0600, refusing to
// replace a credential already there.
func writeCredential(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	for name := range files {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			return fmt.Errorf("%s already holds a credential (%s): revoke it and remove it first, or write to another directory", dir, name)
		}
	}
	for name, b := range files {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, werr := f.Write(b)
		if err := errors.Join(werr, f.Close()); err != nil {
			return err
		}
	}
	return nil
}

func newTokenRevokeCmd() *cobra.Command {
	var dir, address, credentials, reason string
	cmd := &cobra.Command{
		Use:   "revoke [ID]",
		Short: "Revoke a credential by its id (or --credentials DIR): every head refuses it from then on",
		Long: `revoke commits a credential's revocation through the heads' log (auth/revoked/ID): every head
refuses its token and the certificates made for it from then on (agents within seconds), and
the revocation is an event (atoll events). Give the id that token create printed, or
--credentials with the directory it wrote.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var rev api.Revocation
			switch {
			case len(args) == 1 && credentials != "":
				return errors.New("token revoke: give an id or --credentials, not both")
			case len(args) == 1:
				rev.ID = args[0]
			case credentials != "":
				b, err := os.ReadFile(filepath.Join(credentials, credTokenFile))
				if err != nil {
					return fmt.Errorf("token revoke: %w", err)
				}
				c, err := authz.ReadClaims(strings.TrimSpace(string(b)))
				if err != nil {
					return fmt.Errorf("token revoke: %s: %w", credentials, err)
				}
				rev.ID, rev.Principal = c.ID, c.Principal
			default:
				return errors.New("token revoke: which credential? give its id or --credentials DIR")
			}
			rev.Reason = reason
			if err := rev.CheckBounds(); err != nil {
				return fmt.Errorf("token revoke: %w", err)
			}
			addr, _, err := clusterAddress(dir, address)
			if err != nil {
				return fmt.Errorf("token revoke: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			c, err := dialCluster(ctx, addr)
			if err != nil {
				return fmt.Errorf("token revoke: %w", err)
			}
			if err := c.Do(ctx, http.MethodPost, "/v1/tokens/revoke", rev, nil); err != nil {
				return fmt.Errorf("token revoke: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s\n", rev.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	f.StringVar(&credentials, "credentials", "", "the directory of the credential to revoke (as token create wrote it)")
	f.StringVar(&reason, "reason", "", "why (kept with the revocation)")
	return cmd
}

func newTokenRevokedCmd() *cobra.Command {
	var dir, address string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "revoked",
		Short: "List the revoked credentials",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			addr, _, err := clusterAddress(dir, address)
			if err != nil {
				return fmt.Errorf("token revoked: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			c, err := dialCluster(ctx, addr)
			if err != nil {
				return fmt.Errorf("token revoked: %w", err)
			}
			l, err := c.List(ctx, api.RevokedPrefix)
			if err != nil {
				return fmt.Errorf("token revoked: %w", err)
			}
			out := cmd.OutOrStdout()
			for _, kv := range l.KVs {
				var r api.Revocation
				if json.Unmarshal(kv.Value, &r) != nil {
					continue
				}
				if asJSON {
					b, _ := json.Marshal(r)
					fmt.Fprintln(out, string(b))
					continue
				}
				fmt.Fprintf(out, "%s  %s  %s by %s %s\n", r.ID, r.Principal, r.Time.UTC().Format(time.RFC3339), r.By, r.Reason)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	f.BoolVar(&asJSON, "json", false, "one JSON object per line")
	return cmd
}
