package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
)

// The least-privilege test plays a hostile worker and a hostile driver on a cluster of
// processes (issue 25): every write outside their scope is refused with a 403 naming the
// role and the action, nothing in the log changes, every refusal is an audit event, and
// their own work goes on.

// probe asks a hostile worker to try, from inside its own process and with its own
// credential (its spec file's), every write outside its scope; it answers a probeReport in
// JSON.
type probe struct {
	Victim, VictimGang string
	Object             string // an object of the victim's job
}

// attempt is one hostile request and what it got.
type attempt struct {
	What   string
	Action string // the action the refusal must name
	Code   int
	Body   string
	Err    string
}

type probeReport struct {
	// Principal is the principal of the worker's credential (its spec file's token);
	// TokenSHA the SHA-256 of that token, to compare with the cluster token's.
	Principal string
	TokenSHA  string
	Attempts  []attempt
	// Pull and Call are what pulling the victim's object over the transfer plane and
	// calling the victim's actor got.
	Pull, Call string
}

// hostile is a worker that attacks when probed, and otherwise answers.
type hostile struct{}

func (hostile) Receive(ctx *sdk.Context, msg any) (any, error) {
	switch m := msg.(type) {
	case probe:
		rep, err := probeFromWorker(ctx, m)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(rep)
		return string(b), err
	case tick:
		return "alive", nil
	}
	return nil, fmt.Errorf("hostile: unknown message %T", msg)
}

// rawCaller makes raw requests to the leader head and to agents with one credential: a
// token and the certificate made for it.
type rawCaller struct {
	token string
	hc    *http.Client
	cl    *api.Client
	id    *pki.Identity
}

func newRawCaller(ctx context.Context, heads []string, token string, cert tls.Certificate, caPEM []byte) (*rawCaller, error) {
	id, err := pki.IdentityOf(caPEM, cert)
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = id.Client()
	cl, err := api.NewClient(ctx, api.ClientConfig{Heads: heads, Token: token, TLS: id.Client()})
	if err != nil {
		return nil, err
	}
	return &rawCaller{token: token, hc: &http.Client{Transport: tr, Timeout: 20 * time.Second}, cl: cl, id: id}, nil
}

// leader is the leader head's API address.
func (c *rawCaller) leader(ctx context.Context) (string, error) {
	st, err := c.cl.Status(ctx)
	if err != nil {
		return "", err
	}
	for _, h := range st.Heads {
		if h.ID == st.Leader {
			return h.Address, nil
		}
	}
	return "", fmt.Errorf("no address of the leader %d", st.Leader)
}

// do sends one request to base (the leader when base is ""; a 421 sends it to the new
// leader) and records what it got.
func (c *rawCaller) do(ctx context.Context, base, method, path string, body any, what string, action authz.Action) attempt {
	a := attempt{What: what, Action: string(action)}
	for try := 0; try < 5; try++ {
		u := base
		if u == "" {
			var err error
			if u, err = c.leader(ctx); err != nil {
				a.Err = err.Error()
				return a
			}
		}
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequestWithContext(ctx, method, u+path, rd)
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := c.hc.Do(req)
		if err != nil {
			a.Err = err.Error()
			return a
		}
		out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		a.Code, a.Body, a.Err = resp.StatusCode, string(out), ""
		if resp.StatusCode != http.StatusMisdirectedRequest || base != "" {
			return a
		}
	}
	return a
}

// victimObject finds where an object is: its record, and the API of an agent whose store
// holds it.
func (c *rawCaller) victimObject(ctx context.Context, id string) (agentAPI, location string, err error) {
	var rec struct {
		Locations []string `json:"locations"`
	}
	found, err := c.cl.Get(ctx, api.TableObjects+id, &rec)
	if err != nil || !found || len(rec.Locations) == 0 {
		return "", "", fmt.Errorf("object %s: %v (found %v)", id, err, found)
	}
	l, err := c.cl.List(ctx, api.TableMachines)
	if err != nil {
		return "", "", err
	}
	for _, kv := range l.KVs {
		var m api.Machine
		if json.Unmarshal(kv.Value, &m) == nil && m.Agent.Transfer == rec.Locations[0] {
			return m.Agent.API, m.Agent.Transfer, nil
		}
	}
	return "", "", fmt.Errorf("object %s: no agent at %s", id, rec.Locations[0])
}

// attacks are the writes outside a principal's scope that both the hostile worker and the
// hostile driver try (own is the attacker's own job).
func attacks(ctx context.Context, c *rawCaller, own string, p probe) []attempt {
	victimGang := api.TableGangs + p.Victim + "/" + p.VictimGang
	put := func(key string, v any) meta.Request {
		b, _ := json.Marshal(v)
		return meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: key, Value: b}}}
	}
	out := []attempt{
		c.do(ctx, "", "POST", "/v1/propose", put(victimGang, map[string]string{"state": "stopped"}), "a raw log entry", authz.ActPropose),
		c.do(ctx, "", "POST", "/v1/members/add?id=9&addr=127.0.0.1:1", nil, "a Paxos member added", authz.ActMembers),
		c.do(ctx, "", "POST", "/v1/members/remove?id=1", nil, "a Paxos member removed", authz.ActMembers),
		c.do(ctx, "", "POST", "/v1/txn", put(victimGang, map[string]string{"state": "stopped"}), "the victim's gang record", authz.ActKVControl),
		c.do(ctx, "", "POST", "/v1/txn", put(api.TableConfig+"scheduler", map[string]any{}), "the scheduler's configuration record", authz.ActKVControl),
		c.do(ctx, "", "POST", "/v1/txn", put(api.TableCheckpoints+api.CheckpointKey(p.Victim, p.VictimGang, 99), map[string]any{}), "a checkpoint of the victim", authz.ActKVCheckpoints),
		c.do(ctx, "", "POST", "/v1/txn", put(api.TableObjects+p.Object, map[string]any{"id": p.Object, "owner": "job/" + own}), "the victim's object record", authz.ActKVObjects),
		c.do(ctx, "", "POST", "/v1/jobs/stop?job="+p.Victim, nil, "the victim job stopped", authz.ActJobWrite),
		c.do(ctx, "", "POST", "/v1/jobs", api.Job{Name: p.Victim}, "the victim job submitted again", authz.ActJobSubmit),
		c.do(ctx, "", "POST", "/v1/gangs/stop?job="+p.Victim+"&gang="+p.VictimGang, nil, "the victim's gang stopped", authz.ActGangWrite),
		c.do(ctx, "", "POST", "/v1/gangs", api.GangSpec{Job: p.Victim, Name: "intruder", Kind: "counter", Workers: 1}, "a gang in the victim job", authz.ActGangWrite),
		c.do(ctx, "", "POST", "/v1/workers/ready", api.Worker{Job: p.Victim, Gang: p.VictimGang, Rank: 0, Generation: 0}, "the victim's worker record", authz.ActWorkerReady),
		c.do(ctx, "", "POST", "/v1/workers/exited", api.WorkerExit{Job: p.Victim, Gang: p.VictimGang, Rank: 0, Reason: "hostile"}, "the victim's worker reported dead", authz.ActWorkerExited),
		c.do(ctx, "", "POST", "/v1/machines/register", api.Machine{Name: "intruder"}, "a machine registered", authz.ActMachineReport),
		c.do(ctx, "", "PUT", "/v1/scheduler", api.SchedulerConfig{}, "the scheduler's configuration", authz.ActConfigWrite),
		c.do(ctx, "", "POST", "/v1/machines/drain", api.DrainRequest{Machine: "m-1", Reason: "hostile"}, "a machine drained", authz.ActMachineDrain),
		c.do(ctx, "", "POST", "/v1/tokens", api.TokenRequest{Principal: authz.Worker(p.Victim, p.VictimGang, 0).String()}, "a credential of the victim's worker", authz.ActTokenMint),
		c.do(ctx, "", "POST", "/v1/tokens/revoke", api.Revocation{ID: "0123456789abcdef"}, "a revocation", authz.ActTokenRevoke),
		c.do(ctx, "", "POST", "/v1/certs", api.CertRequest{Name: "intruder", CSR: "x", Principal: "admin"}, "an admin certificate", authz.ActCertSign),
		c.do(ctx, "", "GET", "/v1/get?key="+victimGang, nil, "the victim's gang record read", authz.ActReadJob),
		c.do(ctx, "", "GET", "/v1/list?prefix="+api.TableJobs+p.Victim, nil, "the victim's job record listed", authz.ActReadJob),
		c.do(ctx, "", "GET", "/v1/list?prefix="+api.TableEvents, nil, "the event and audit log read", authz.ActReadControl),
		c.do(ctx, "", "GET", "/v1/range?prefix="+api.TableAuth, nil, "the revocations read", authz.ActReadControl),
	}
	agentAPI, _, err := c.victimObject(ctx, p.Object)
	if err != nil {
		return append(out, attempt{What: "the victim's object", Err: err.Error()})
	}
	ref := api.ObjectRef{ID: p.Object, Holder: "job/" + own}
	return append(out,
		c.do(ctx, agentAPI, "POST", "/v1/objects/free", ref, "the victim's object freed", authz.ActObjectWrite),
		c.do(ctx, agentAPI, "POST", "/v1/objects/drop", ref, "the victim's object dropped", authz.ActObjectWrite),
		c.do(ctx, agentAPI, "POST", "/v1/objects/map", ref, "the victim's object mapped", authz.ActObjectRead),
		c.do(ctx, agentAPI, "POST", "/v1/objects/release", api.ObjectRef{ID: p.Object, Holder: "job/" + p.Victim}, "the victim's reference released", authz.ActObjectHold),
		c.do(ctx, agentAPI, "POST", fmt.Sprintf("/v1/workers/kill?job=%s&gang=%s&rank=0", p.Victim, p.VictimGang), nil, "the victim's worker killed", authz.ActWorkerKill),
		c.do(ctx, agentAPI, "GET", fmt.Sprintf("/v1/logs?job=%s&gang=%s&rank=0", p.Victim, p.VictimGang), nil, "the victim's logs", authz.ActLogsRead),
	)
}

// pullVictim opens the victim's object on the transfer plane of the store that holds it.
func (c *rawCaller) pullVictim(ctx context.Context, linkKey []byte, id string) string {
	_, loc, err := c.victimObject(ctx, id)
	if err != nil {
		return err.Error()
	}
	oid, err := object.ParseID(id)
	if err != nil {
		return err.Error()
	}
	cc := transfer.DefaultClientConfig()
	cc.Token, cc.TLS = linkKey, c.id.Client()
	cl, err := transfer.NewClient(cc)
	if err != nil {
		return err.Error()
	}
	defer cl.Close()
	cn, err := cl.Dial(ctx, loc)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer cn.Close()
	if _, err := cn.Open(ctx, oid); err != nil {
		if errors.Is(err, transfer.ErrDenied) {
			return "denied: " + err.Error()
		}
		return err.Error()
	}
	return "opened"
}

// probeFromWorker is the hostile worker's attack, with the credential of its spec file.
func probeFromWorker(ctx *sdk.Context, p probe) (probeReport, error) {
	spec, err := api.ReadWorkerSpec(os.Getenv(api.WorkerEnv))
	if err != nil {
		return probeReport{}, err
	}
	sum := sha256.Sum256([]byte(spec.Token))
	rep := probeReport{TokenSHA: hex.EncodeToString(sum[:])}
	if c, err := authz.ReadClaims(spec.Token); err == nil {
		rep.Principal = c.Principal
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// Its own certificate, as its process got one: for the principal its token names.
	if _, err := api.RequestIdentityAs(actx, spec.Heads, spec.Token, []byte(spec.CACert), "intruder", "admin"); err == nil || !errors.Is(err, api.ErrForbidden) {
		rep.Attempts = append(rep.Attempts, attempt{What: "an admin certificate asked for", Err: fmt.Sprintf("got %v, want forbidden", err)})
	}
	id, err := api.RequestIdentity(actx, spec.Heads, spec.Token, []byte(spec.CACert), "hostile")
	if err != nil {
		return probeReport{}, err
	}
	c, err := newRawCaller(actx, spec.Heads, spec.Token, id.Certificate(), []byte(spec.CACert))
	if err != nil {
		return probeReport{}, err
	}
	rep.Attempts = append(rep.Attempts, attacks(actx, c, spec.Job, p)...)
	rep.Pull = c.pullVictim(actx, []byte(spec.LinkKey), p.Object)
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	defer ccancel()
	if ref, err := sdk.Lookup(cctx, ctx, p.Victim+"/"+p.VictimGang); errors.Is(err, sdk.ErrForbidden) {
		rep.Call = "refused: " + err.Error() // another job's records are not its to read
	} else if err != nil {
		rep.Call = "lookup: " + err.Error()
	} else if n, err := sdk.Call[int](cctx, ctx, ref, bump{}); err != nil {
		rep.Call = "refused: " + err.Error()
	} else {
		rep.Call = fmt.Sprintf("answered %d", n)
	}
	return rep, nil
}

// checkRefused checks that every attempt was refused with a 403 naming the role and the
// action, and returns how many were.
func checkRefused(t *testing.T, who, role string, as []attempt) int {
	t.Helper()
	n := 0
	for _, a := range as {
		if a.Code != http.StatusForbidden || !strings.Contains(a.Body, "role "+role) || !strings.Contains(a.Body, a.Action) {
			t.Errorf("%s: %s: %d %s %s; want a 403 naming role %s and %s", who, a.What, a.Code, a.Body, a.Err, role, a.Action)
			continue
		}
		n++
	}
	return n
}

// logState is what the attacks must not change: the victim's records, the configuration
// and the membership (each key with its revision).
func logState(ctx context.Context, t *testing.T, d *dialed, victim, object string) string {
	t.Helper()
	var b strings.Builder
	for _, prefix := range []string{api.TableJobs + victim, api.TableGangs + victim + "/", api.TableWorkers + victim + "/", api.TableCheckpoints + victim + "/",
		api.TableConfig, api.TableObjects + object, api.TableAuth, api.TableMachines} {
		kvs, err := d.Meta().Range(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range kvs {
			fmt.Fprintf(&b, "%s@%d v%d\n", kv.Key, kv.ModRevision, kv.Version)
		}
	}
	st, err := d.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range st.Heads {
		fmt.Fprintf(&b, "head %d\n", h.ID)
	}
	return b.String()
}

// awaitRefusals waits until the event log holds at least want refusals by each principal.
func awaitRefusals(ctx context.Context, t *testing.T, d *dialed, want map[string]int) map[string]map[string]int {
	t.Helper()
	got := map[string]map[string]int{} // principal -> action -> refusals
	stop := errors.New("all refusals seen")
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := d.Watch(wctx, api.TableEvents, func(reset bool, l api.Listing, evs []meta.Event) error {
		kvs := l.KVs
		if reset {
			got = map[string]map[string]int{}
		}
		for _, ev := range evs {
			if ev.Type == meta.EventPut {
				kvs = append(kvs, ev.KV)
			}
		}
		for _, kv := range kvs {
			var e api.Event
			if json.Unmarshal(kv.Value, &e) != nil || e.Kind != api.EventRefused {
				continue
			}
			if got[e.By] == nil {
				got[e.By] = map[string]int{}
			}
			got[e.By][e.Action]++
		}
		for who, n := range want {
			total := 0
			for _, k := range got[who] {
				total += k
			}
			if total < n {
				return nil
			}
		}
		return stop
	})
	if !errors.Is(err, stop) {
		t.Fatalf("refusal events: %v, seen %v, want %v", err, got, want)
	}
	return got
}

func TestHostileWorkerAndDriverAreConfined(t *testing.T) {
	t.Parallel()
	bin, dir := upCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	addr, _, err := clusterAddress(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	adm, err := dialCluster(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	clusterToken, err := sdk.ReadTokenFile(filepath.Join(dir, tokenFileName))
	if err != nil {
		t.Fatal(err)
	}

	// The victim: an admin's driver (the cluster token) and a gang whose worker put an
	// object in its machine's store.
	vc, victim := connectJob(ctx, t, dir, "victim")
	vg, err := victim.SpawnGang(ctx, sdk.GangSpec{Name: "vg", Kind: "blob", Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vg.AwaitRunning(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := sdk.Call[int](ctx, vc, vg.Worker(0), bump{}); err != nil || n != 1 {
		t.Fatalf("the victim's first step: %d, %v", n, err)
	}
	vid, err := sdk.Call[string](ctx, vc, vg.Worker(0), putOwned{Tag: 1})
	if err != nil {
		t.Fatal(err)
	}
	vobj := sdk.Ref[[]byte]{ID: vid}

	// The attacker's credential: a driver of job mallory (atoll token create).
	cred := filepath.Join(t.TempDir(), "mallory")
	if out, err := exec.Command(bin, "token", "create", "--dir", dir, "--role", "driver", "--job", "mallory", "--ttl", "1h", "--out", cred).CombinedOutput(); err != nil {
		t.Fatalf("atoll token create: %v\n%s", err, out)
	}
	for _, f := range []string{credTokenFile, credCertFile, credKeyFile, credCAFile} {
		st, err := os.Stat(filepath.Join(cred, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v, want mode 0600", f, st.Mode(), err)
		}
	}
	heads, _ := sdk.ParseClusterAddress(addr)
	mc, err := sdk.Connect(ctx, strings.Join(heads.Heads, ",")+";credentials="+cred, testKinds()...)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Shutdown(context.Background())
	mallory, err := mc.Submit(ctx, sdk.JobSpec{Name: "mallory"})
	if err != nil {
		t.Fatal(err)
	}
	// A job of a new name is its submitter's (as a submitted driver's program names its job).
	other, err := mc.Submit(ctx, sdk.JobSpec{Name: "mallory-2"})
	if err != nil {
		t.Fatalf("driver/mallory submits a job of a new name: %v", err)
	}
	var rec api.Job
	if _, err := adm.Get(ctx, api.TableJobs+"mallory-2", &rec); err != nil || rec.Principal != "driver/mallory" {
		t.Errorf("the new job's record: %+v %v, want it driver/mallory's", rec, err)
	}
	if err := other.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	hg, err := mallory.SpawnGang(ctx, sdk.GangSpec{Name: "hg", Kind: "hostile", Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hg.AwaitRunning(ctx, 0); err != nil {
		t.Fatal(err)
	}
	before := logState(ctx, t, adm, "victim", vobj.ID)
	p := probe{Victim: "victim", VictimGang: "vg", Object: vobj.ID}

	// The hostile worker, from inside its process.
	out, err := sdk.Call[string](ctx, mc, hg.Worker(0), p)
	if err != nil {
		t.Fatal(err)
	}
	var rep probeReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	ctSum := sha256.Sum256(clusterToken)
	if rep.TokenSHA == hex.EncodeToString(ctSum[:]) || rep.Principal != "worker/mallory/hg/0" {
		t.Errorf("the worker's spec file holds %q (the cluster token: %v); want its own credential", rep.Principal, rep.TokenSHA == hex.EncodeToString(ctSum[:]))
	}
	workerRefusals := checkRefused(t, "worker/mallory/hg/0", "worker", rep.Attempts)
	if !strings.HasPrefix(rep.Pull, "denied") {
		t.Errorf("the worker pulled the victim's object: %s", rep.Pull)
	}
	if !strings.HasPrefix(rep.Call, "refused") {
		t.Errorf("the worker called the victim's actor: %s", rep.Call)
	}

	// The hostile driver, with the files of its credential, as curl would use them.
	dc := credCaller(ctx, t, heads.Heads, cred)
	driverAttempts := attacks(ctx, dc, "mallory", p)
	driverRefusals := checkRefused(t, "driver/mallory", "driver", driverAttempts)
	var who api.WhoAmI
	if err := dc.cl.Do(ctx, "GET", "/v1/whoami", nil, &who); err != nil || who.Principal != "driver/mallory" {
		t.Fatalf("whoami: %+v %v", who, err)
	}
	if pull := dc.pullVictim(ctx, []byte(who.LinkKey), vobj.ID); !strings.HasPrefix(pull, "denied") {
		t.Errorf("the driver pulled the victim's object: %s", pull)
	}
	if _, err := sdk.Get(ctx, mc, sdk.Ref[[]byte]{ID: vobj.ID}); err == nil {
		t.Error("the driver got the victim's object through the SDK")
	}
	// Another job's actor is not even found by name (its records are its job's to read);
	// a ref the victim's driver looked up is refused too.
	if _, err := sdk.Lookup(ctx, mc, "victim/vg"); !errors.Is(err, sdk.ErrForbidden) {
		t.Errorf("the driver looked up the victim's actor: %v, want ErrForbidden", err)
	}
	if ref, err := sdk.Lookup(ctx, vc, "victim/vg"); err != nil {
		t.Errorf("the victim's own lookup: %v", err)
	} else {
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		if n, err := sdk.Call[int](cctx, mc, ref, bump{}); err == nil {
			t.Errorf("the driver called the victim's actor: %d", n)
		}
		ccancel()
		if err := sdk.StopActor(ctx, mc, ref); !errors.Is(err, sdk.ErrForbidden) {
			t.Errorf("the driver stopped the victim's actor: %v, want ErrForbidden", err)
		}
	}

	// Nothing of the victim, the configuration or the membership changed.
	if after := logState(ctx, t, adm, "victim", vobj.ID); after != before {
		t.Errorf("the log changed under the attacks:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// Every refusal is an audit event at the leader.
	got := awaitRefusals(ctx, t, adm, map[string]int{"worker/mallory/hg/0": workerRefusals, "driver/mallory": driverRefusals})
	for _, a := range driverAttempts {
		if got["driver/mallory"][a.Action] == 0 {
			t.Errorf("no refusal event of driver/mallory for %s", a.Action)
		}
	}
	auditOut, err := exec.Command(bin, "events", "--dir", dir, "--audit").CombinedOutput()
	if err != nil || !strings.Contains(string(auditOut), "refused") || !strings.Contains(string(auditOut), "by driver/mallory (log.propose)") {
		t.Errorf("atoll events --audit: %v\n%s", err, auditOut)
	}

	// Their own work goes on, and the victim's.
	if s, err := sdk.Call[string](ctx, mc, hg.Worker(0), tick{}); err != nil || s != "alive" {
		t.Errorf("the hostile worker's own work: %q %v", s, err)
	}
	if n, err := sdk.Call[int](ctx, vc, vg.Worker(0), bump{}); err != nil || n != 2 {
		t.Errorf("the victim's step after the attacks: %d, %v; want 2 (nothing of it changed)", n, err)
	}
	if b, err := sdk.Get(ctx, vc, vobj); err != nil || !strings.HasPrefix(string(b), "owned by a worker incarnation") {
		t.Errorf("the victim's object after the attacks: %q %v", b, err)
	}
	mine, err := sdk.Put(ctx, mc, []byte("mallory's own data"))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := sdk.Get(ctx, mc, mine); err != nil || string(b) != "mallory's own data" {
		t.Errorf("mallory's own object: %q %v", b, err)
	}

	// Its job stopped, the worker's spec file is gone from its agent's run directory.
	if err := mallory.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the hostile worker's spec file removed", time.Minute, func() (bool, string) {
		left, _ := filepath.Glob(filepath.Join(dir, "agents", "*", "run", "mallory.*"))
		return len(left) == 0, fmt.Sprint(left)
	})
	// Revoked, the driver's credential opens nothing.
	if out, err := exec.Command(bin, "token", "revoke", "--dir", dir, "--credentials", cred).CombinedOutput(); err != nil {
		t.Fatalf("atoll token revoke: %v\n%s", err, out)
	}
	if a := dc.do(ctx, heads.Heads[0], "GET", "/v1/whoami", nil, "whoami", ""); a.Code != http.StatusUnauthorized || !strings.Contains(a.Body, "revoked") {
		t.Errorf("a revoked credential: %d %s %s", a.Code, a.Body, a.Err)
	}
}

// TestScopedAgentCredential runs an agent on a credential of its own machine (atoll token
// create --role agent) instead of the cluster token: it registers, gossips with the key
// the heads gave it, runs a gang's worker whose calls and objects go through its API and
// transfer plane (the callers' tokens reviewed by the heads), and its credential is
// refused what is not that machine's agent's. A credential of another machine starts no
// agent.
func TestScopedAgentCredential(t *testing.T) {
	t.Parallel()
	bin, dir := upCluster(t, 1)
	ctx, cancel := testtime.Context(t, 4*time.Minute)
	defer cancel()
	addr, _, err := clusterAddress(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	adm, err := dialCluster(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	cred := filepath.Join(t.TempDir(), "extra")
	if out, err := exec.Command(bin, "token", "create", "--dir", dir, "--role", "agent", "--machine", "extra", "--ttl", "1h", "--out", cred).CombinedOutput(); err != nil {
		t.Fatalf("atoll token create --role agent: %v\n%s", err, out)
	}
	// A credential of another machine: refused before the agent starts anything.
	cf, err := readClusterFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	wrong := exec.CommandContext(ctx, bin, "agent", "--join", cf.Address, "--name", "impostor", "--machine", cf.Machine, "--dir", filepath.Join(t.TempDir(), "impostor"),
		"--token-file", filepath.Join(cred, credTokenFile), "--ca-cert", filepath.Join(cred, credCAFile))
	if out, err := wrong.CombinedOutput(); err == nil || !strings.Contains(string(out), "agent/extra") {
		t.Errorf("an agent named impostor on agent/extra's credential: %v\n%s; want it refused, naming the credential's principal", err, out)
	}

	startAgentAs(ctx, t, bin, dir, "extra", filepath.Join(cred, credTokenFile), adm, 0)
	// Its gossip key is the heads' (a wrong one fails the join, and the agent with it).
	// The agent registers before it joins the gossip: wait for the join.
	waitFor(t, "the scoped agent joined the gossip", time.Minute, func() (bool, string) {
		logb, _ := os.ReadFile(filepath.Join(dir, "logs", "extra.log"))
		return strings.Contains(string(logb), "joined the cluster's gossip"), string(logb)
	})
	// Its credential is that machine's agent's: admin's writes and another machine's
	// reports are refused.
	heads, _ := sdk.ParseClusterAddress(addr)
	ac := credCaller(ctx, t, heads.Heads, cred)
	checkRefused(t, "agent/extra", "agent", []attempt{
		ac.do(ctx, "", "POST", "/v1/propose", meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: api.TableConfig + "x", Value: []byte("{}")}}}, "a raw log entry", authz.ActPropose),
		ac.do(ctx, "", "POST", "/v1/machines/load", api.LoadReport{Machine: "node-0"}, "another machine's load", authz.ActMachineReport),
		ac.do(ctx, "", "POST", "/v1/machines/drain", api.DrainRequest{Machine: "node-0"}, "a machine drained", authz.ActMachineDrain),
		ac.do(ctx, "", "POST", "/v1/tokens", api.TokenRequest{Principal: "driver/any"}, "a driver's credential", authz.ActTokenMint),
	})

	// Work placed on it: the other machine is drained, so the gang lands on extra.
	if out, err := exec.Command(bin, "drain", "node-0", "--dir", dir).CombinedOutput(); err != nil {
		t.Fatalf("atoll drain node-0: %v\n%s", err, out)
	}
	c, job := connectJob(ctx, t, dir, "on-extra")
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "g", Kind: "blob", Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.AwaitRunning(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if ms := g.Placement().Machines; len(ms) != 1 || ms[0] != "extra" {
		t.Fatalf("the gang is on %v, want extra (node-0 is drained)", ms)
	}
	if n, err := sdk.Call[int](ctx, c, g.Worker(0), bump{}); err != nil || n != 1 {
		t.Fatalf("a call to the worker on extra: %d, %v", n, err)
	}
	id, err := sdk.Call[string](ctx, c, g.Worker(0), putOwned{Tag: 7})
	if err != nil {
		t.Fatalf("the worker puts an object into extra's store (its token reviewed by the heads): %v", err)
	}
	if b, err := sdk.Get(ctx, c, sdk.Ref[[]byte]{ID: id}); err != nil || !strings.HasPrefix(string(b), "owned by a worker incarnation") {
		t.Fatalf("the driver reads the worker's object from extra: %q %v", b, err)
	}

	// agent/*, the credential a DaemonSet's agents share: an agent of any name starts on it
	// (its certificate then names its own machine), and it is refused what is not an
	// agent's.
	wild := filepath.Join(t.TempDir(), "wild")
	if out, err := exec.Command(bin, "token", "create", "--dir", dir, "--role", "agent", "--machine", "*", "--ttl", "1h", "--out", wild).CombinedOutput(); err != nil {
		t.Fatalf("atoll token create --role agent --machine '*': %v\n%s", err, out)
	}
	startAgentAs(ctx, t, bin, dir, "wild-1", filepath.Join(wild, credTokenFile), adm, 0)
	// It registers before it joins the gossip: wait for the join (read once, the log
	// missed it under load in CI).
	waitFor(t, "the agent on agent/* joined the gossip", time.Minute, func() (bool, string) {
		logb, _ := os.ReadFile(filepath.Join(dir, "logs", "wild-1.log"))
		return strings.Contains(string(logb), "joined the cluster's gossip"), string(logb)
	})
	wc := credCaller(ctx, t, heads.Heads, wild)
	checkRefused(t, "agent/*", "agent", []attempt{
		wc.do(ctx, "", "POST", "/v1/propose", meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: api.TableConfig + "x", Value: []byte("{}")}}}, "a raw log entry", authz.ActPropose),
		wc.do(ctx, "", "POST", "/v1/machines/drain", api.DrainRequest{Machine: "node-0"}, "a machine drained", authz.ActMachineDrain),
		wc.do(ctx, "", "POST", "/v1/tokens", api.TokenRequest{Principal: "driver/any"}, "a driver's credential", authz.ActTokenMint),
	})
}

// credCaller is a raw caller on the files of a credential directory (atoll token create's
// token, certificate, key and CA), as curl would use them.
func credCaller(ctx context.Context, t *testing.T, heads []string, cred string) *rawCaller {
	t.Helper()
	tok, err := os.ReadFile(filepath.Join(cred, credTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(cred, credCertFile), filepath.Join(cred, credKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(cred, credCAFile))
	if err != nil {
		t.Fatal(err)
	}
	c, err := newRawCaller(ctx, heads, strings.TrimSpace(string(tok)), cert, caPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
