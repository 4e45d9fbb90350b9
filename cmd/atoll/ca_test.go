package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/sdk"
)

// TestCARotationWithoutDowntime rotates the cluster CA of a running cluster (3 heads, an
// agent, a driver, a worker process) through its three steps: the worker keeps its
// incarnation and answers after each step, fresh commands connect after each step, and
// after the last a certificate of the old CA is refused while one of the new CA's works.
func TestCARotationWithoutDowntime(t *testing.T) {
	t.Parallel()
	bin, dir := upCluster(t, 1)
	ctx, cancel := testtime.Context(t, 5*time.Minute)
	defer cancel()
	atoll := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		return string(out), err
	}
	status := func() caStatus {
		t.Helper()
		out, err := atoll("ca", "status", "--dir", dir, "--json")
		if err != nil {
			t.Fatalf("atoll ca status: %v\n%s", err, out)
		}
		var st caStatus
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("atoll ca status --json: %v\n%s", err, out)
		}
		return st
	}
	before := status()
	if before.Phase != pki.PhaseSteady || len(before.Heads) != 3 || before.Heads[0].Phase != pki.PhaseSteady || len(before.Heads[0].Trusts) != 1 {
		t.Fatalf("before the rotation: %+v", before)
	}
	oldCred := filepath.Join(t.TempDir(), "old")
	if out, err := atoll("token", "create", "--dir", dir, "--role", "driver", "--job", "rot", "--ttl", "1h", "--out", oldCred); err != nil {
		t.Fatalf("atoll token create: %v\n%s", err, out)
	}

	c, job := connectJob(ctx, t, dir, "rot")
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "g", Kind: "blob", Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.AwaitRunning(ctx, 0); err != nil {
		t.Fatal(err)
	}
	calls := 0
	works := func(step string) {
		t.Helper()
		calls++
		// The same incarnation counts on: it was never restarted.
		if n, err := sdk.Call[int](ctx, c, g.Worker(0), bump{}); err != nil || n != calls {
			t.Fatalf("%s: a call to the worker: %d, %v; want %d from the same incarnation", step, n, err, calls)
		}
		// The worker puts into its agent's store; the driver pulls it from there.
		id, err := sdk.Call[string](ctx, c, g.Worker(0), putOwned{Tag: calls})
		if err != nil {
			t.Fatalf("%s: the worker's put: %v", step, err)
		}
		if b, err := sdk.Get(ctx, c, sdk.Ref[[]byte]{ID: id}); err != nil || len(b) == 0 {
			t.Fatalf("%s: the driver's get of the worker's object: %v", step, err)
		}
		// A new process: fresh handshakes with every head it reaches.
		if out, err := atoll("status", "--dir", dir); err != nil {
			t.Fatalf("%s: atoll status: %v\n%s", step, err, out)
		}
	}
	works("before the rotation")

	// step runs a rotation step, again while it answers that processes need time to
	// follow the last one (its refusal names what they wait for).
	step := func(args ...string) string {
		t.Helper()
		for {
			out, err := atoll(append([]string{"ca", "rotate", "--dir", dir}, args...)...)
			if err == nil {
				return out
			}
			if !strings.Contains(out, "run it again in") && !strings.Contains(out, "still present certificates of the old CA") {
				t.Fatalf("atoll ca rotate %v: %v\n%s", args, err, out)
			}
			select {
			case <-ctx.Done():
				t.Fatalf("atoll ca rotate %v never went through: %s", args, out)
			case <-time.After(time.Second):
			}
		}
	}
	if out := step(); !strings.Contains(out, "every head trusts the new CA") {
		t.Fatalf("add: %s", out)
	}
	if st := status(); st.Phase != pki.PhaseAdded || len(st.Heads[1].Trusts) != 2 {
		t.Fatalf("after add: %+v", st)
	}
	works("after add")
	if out, err := atoll("ca", "rotate", "--dir", dir, "--finish"); err == nil || !strings.Contains(out, "phase added") {
		t.Fatalf("finish straight after add: %v\n%s; want it refused", err, out)
	}

	if out := step("--activate"); !strings.Contains(out, "every head signs with the new CA") {
		t.Fatalf("activate: %s", out)
	}
	act := status()
	if act.Phase != pki.PhaseActivated || act.Heads[2].Signing == before.Heads[2].Signing || len(act.Heads[2].Trusts) != 2 {
		t.Fatalf("after activate: %+v", act)
	}
	works("after activate")

	step("--finish")
	after := status()
	for _, h := range after.Heads {
		if h.Phase != pki.PhaseSteady || h.Signing != act.Heads[0].Signing || len(h.Trusts) != 1 || h.Trusts[0] != h.Signing || len(h.Stale) != 0 {
			t.Fatalf("after finish, head %+v; want steady, signing and trusting only %s", h, act.Heads[0].Signing)
		}
	}
	works("after finish")

	// The old CA's certificate is refused now, even by a client that trusts the new CA;
	// a credential made now works.
	bundle, err := os.ReadFile(filepath.Join(dir, "tls", pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	get := func(cred string) error {
		cert, err := tls.LoadX509KeyPair(filepath.Join(cred, credCertFile), filepath.Join(cred, credKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := pki.Trust(bundle)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
		tok, _ := os.ReadFile(filepath.Join(cred, credTokenFile))
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, after.Heads[0].Address+"/v1/status", nil)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}).Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	}
	if err := get(oldCred); err == nil {
		t.Fatal("a certificate of the retired CA was served after finish")
	}
	newCred := filepath.Join(t.TempDir(), "new")
	if out, err := atoll("token", "create", "--dir", dir, "--role", "driver", "--job", "rot", "--ttl", "1h", "--out", newCred); err != nil {
		t.Fatalf("atoll token create: %v\n%s", err, out)
	}
	if err := get(newCred); err != nil {
		t.Fatalf("a credential of the new CA: %v", err)
	}
	_ = context.Canceled
}
