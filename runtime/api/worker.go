package api

import (
	"encoding/json"
	"fmt"
	"os"
)

// The contract between an agent and the worker processes it starts (the SDK's worker mode
// reads it): the environment, the spec file, the exit statuses, and the agent API's object
// references.

// WorkerEnv is the environment variable that makes a program a worker: it names the
// worker's spec file (JSON, mode 0600, holding the worker's own credential among the rest;
// the agent removes it when the worker ends).
const WorkerEnv = "ATOLL_WORKER"

// ExitPermanent is the exit status of a worker process that a restart cannot help (an
// unknown kind, undecodable arguments, an unreadable spec): the agent reports its exit as
// permanent, and the gang fails at once.
const ExitPermanent = 78

// SimulatedGPUsEnv lists a worker's simulated GPU UUIDs on a machine whose GPUs are
// declared, not real (CUDA_VISIBLE_DEVICES is then empty: there is no device to see).
const SimulatedGPUsEnv = "ATOLL_SIMULATED_GPUS"

// CACertEnv names the cluster CA certificate's file for a process that connects to a
// cluster (`atoll submit`'s drivers, commands): the address option ca=PATH does the same.
const CACertEnv = "ATOLL_CA_CERT"

// WorkerSpec is everything a worker needs to start: who it is in which gang, its GPUs, and
// how to reach the cluster.
type WorkerSpec struct {
	Job        string `json:"job"`
	Gang       string `json:"gang"`
	Rank       int    `json:"rank"`
	Generation int    `json:"generation"`
	// GangUID tells this gang from an earlier one of the same names.
	GangUID string `json:"gang_uid"`
	// Kind and Args make the worker's actor.
	Kind string   `json:"kind"`
	Args *Payload `json:"args,omitempty"`
	// Machine is the machine it runs on; Member its GPUs there; Placement the whole gang's.
	Machine   string `json:"machine"`
	Simulated bool   `json:"simulated"`
	// TrustedFabric: the operator declared the network between machines trusted and
	// isolated (atoll agent --trusted-fabric): the worker's collective links run without
	// TLS (peers still prove the link key; chunks still checksummed). Never on by default.
	TrustedFabric bool      `json:"trusted_fabric,omitempty"`
	Member        Member    `json:"member"`
	Placement     Placement `json:"placement"`
	// World is the gang's members as its program works with them when the worker starts
	// (member indices in rank order), at world Epoch; a member added by a grow is not in it
	// yet: its driver brings it in (Gang.Yield).
	World []int `json:"world,omitempty"`
	Epoch int   `json:"epoch,omitempty"`
	// Heads are the heads' API URLs. Token is the process's own credential, a scoped token
	// (runtime/authz) for worker/<job>/<gang>/<rank>, or for driver/<job> for a submitted
	// driver, that ends with its job: never the cluster token. LinkKey is the secret of the
	// cluster's process links (actor remote, collectives, transfer plane).
	Heads   []string `json:"heads"`
	Token   string   `json:"token"`
	LinkKey string   `json:"link_key,omitempty"`
	// CACert is the cluster CA's certificate (PEM) when the cluster runs mutual TLS: the
	// worker gets a certificate of its own from the heads with it and the token.
	CACert string `json:"ca_cert,omitempty"`
	// Agent is the machine agent's API URL; Transfer its object store's transfer address.
	Agent    string `json:"agent"`
	Transfer string `json:"transfer"`
	// Holder names the worker to its agent's object store (its references and mappings).
	Holder string `json:"holder"`
	// Service is the service the worker is a replica of (GangSpec.Service): it reports its
	// load to the leader.
	Service string `json:"service,omitempty"`
	// Driver says this is a submitted driver (`atoll submit`), not a worker: it runs the
	// job's executable with the cluster's address.
	Driver bool `json:"driver,omitempty"`
	// Process is a process gang's command (GangSpec.Process): the agent runs it instead of
	// the job's program, with torchrun's environment. Master is the rendezvous address
	// (host:port) of the gang's rank 0 for this generation: MASTER_ADDR and MASTER_PORT.
	Process *ProcessSpec `json:"process,omitempty"`
	Master  string       `json:"master,omitempty"`
}

// Key names the worker: job/gang/rank.g<generation>.
func (s *WorkerSpec) Key() string {
	return fmt.Sprintf("%s/%s/%d.g%d", s.Job, s.Gang, s.Rank, s.Generation)
}

// ReadWorkerSpec reads a worker's spec file, refusing one that others could read.
func ReadWorkerSpec(path string) (WorkerSpec, error) {
	st, err := os.Stat(path)
	if err != nil {
		return WorkerSpec{}, fmt.Errorf("atoll worker: spec %s: %w", path, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return WorkerSpec{}, fmt.Errorf("atoll worker: spec %s has mode %v: it holds the worker's credential and must be readable by its owner only (0600)", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return WorkerSpec{}, fmt.Errorf("atoll worker: spec %s: %w", path, err)
	}
	var s WorkerSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return WorkerSpec{}, fmt.Errorf("atoll worker: spec %s: %w", path, err)
	}
	return s, nil
}

// ObjectRef names an object and the holder acting on it (POST /v1/objects/map, unmap,
// release, free, replicate, persist, verify, drop on an agent).
type ObjectRef struct {
	ID     string `json:"id"`
	Holder string `json:"holder,omitempty"`
	// Durable (replicate) asks for the new copy to be persisted before the answer.
	Durable bool `json:"durable,omitempty"`
	// Cause (drop) is why the copy goes: CauseOwnerDied refuses later gets with the
	// owner-died error; empty, as a free.
	Cause string `json:"cause,omitempty"`
	// Shared (verify) checks the copy in the agent's shared checkpoint directory instead
	// of its store's.
	Shared bool `json:"shared,omitempty"`
}

// ObjectWrite is an agent's answer to a create (POST /v1/objects/create): the new
// object's id and the range of the shared-memory file the worker maps writable and
// writes before it asks for the seal. The file may be one the worker wrote before (the
// store keeps a worker's segments for its next writes), so a worker may keep its
// mappings; Unmap lists the files of its segments dropped since, to unmap.
type ObjectWrite struct {
	ID     string   `json:"id"`
	Path   string   `json:"path"`
	Offset int64    `json:"offset"`
	Size   int64    `json:"size"`
	Unmap  []string `json:"unmap"`
}

// CauseOwnerDied is an ObjectRef's Cause when an object's owner ended.
const CauseOwnerDied = "owner_died"

// ObjectInfo is an agent's answer about one copy of an object (put, persist, replicate,
// verify): its size and checksum (xxhash64), and whether the copy is durable.
type ObjectInfo struct {
	ID          string `json:"id"`
	Holder      string `json:"holder,omitempty"`
	Size        int64  `json:"size"`
	Fingerprint uint64 `json:"fingerprint"`
	Durable     bool   `json:"durable,omitempty"`
	// Location is the transfer address of the store that holds the copy.
	Location string `json:"location,omitempty"`
}

// Error kinds of the agent's object API.
const (
	// KindTooLarge: a put larger than the store's object size limit (object.ErrTooLarge,
	// HTTP 413, the limit named in the message): the putter may store it in parts instead.
	KindTooLarge = "too_large"
	// KindOwnerDied: the object's owner ended, and it with it (object.ErrOwnerDied, HTTP 410).
	KindOwnerDied = "owner_died"
	// KindObjectLost: no copy of the object is left (object.ErrLost, HTTP 410).
	KindObjectLost = "object_lost"
)
