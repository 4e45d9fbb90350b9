package api

import (
	"fmt"
	"strings"
	"time"
)

// Process gangs: gangs whose members run any executable (a Python program under
// torchrun's conventions, an MPI rank, a shell script) instead of the job's own Go
// program in the SDK's worker mode. The agent starts each member's command directly, with
// the environment below, reports it ready once its process has started, signals it a
// notice, and reports how it exited: status 0 of every member completes the gang, the
// yield code after a stop or resize notice yields it (it queues again, or restarts at its
// new size), anything else is a failure (all-for-one restart within MaxRestarts).

// ProcessKind is the Kind of a process gang (GangSpec.Process set): no actor kind runs.
const ProcessKind = "atoll$process"

// DefaultYieldExitCode is the exit status by which a process gang's member says it
// checkpointed and yields after a notice, when its spec names none: 75, EX_TEMPFAIL of
// sysexits.h ("try again later").
const DefaultYieldExitCode = 75

// DefaultNoticeSignal is the signal a process gang's members get with a notice when their
// spec names none (as Slurm's --signal).
const DefaultNoticeSignal = "SIGUSR1"

// noticeSignals are the signals a notice may be given by: those a program can catch and
// whose default action is not a core dump.
var noticeSignals = []string{"SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP"}

// The environment of a process gang's member beyond torchrun's (RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) and
// CUDA_VISIBLE_DEVICES.
const (
	JobEnv        = "ATOLL_JOB"
	GangEnv       = "ATOLL_GANG"
	RankEnv       = "ATOLL_RANK"
	MemberEnv     = "ATOLL_MEMBER"
	GenerationEnv = "ATOLL_GENERATION"
	NoticeFileEnv = "ATOLL_NOTICE_FILE"
	YieldCodeEnv  = "ATOLL_YIELD_EXIT_CODE"
	GPUIndexEnv   = "ATOLL_GPUS"
	MachineEnv    = "ATOLL_MACHINE"
)

// processEnvNames are the variables the agent sets for a process gang's member: a spec's
// Env may not set them (nor any ATOLL_ variable).
var processEnvNames = []string{"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
	"MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"}

// ProcessSpec is what a process gang's members run.
type ProcessSpec struct {
	// Command is the executable and its arguments. A bare name is looked up in the agent's
	// PATH; a relative path is taken from the job's directory (Job.Dir) when that exists
	// on the member's machine. Nothing is copied: the command must be on every machine.
	Command []string `json:"command"`
	// Env is NAME=value for the members' environment (never secrets: it is stored in the
	// log), after the agent's own environment and the job's, before the variables the
	// agent sets (which it may not name).
	Env []string `json:"env,omitempty"`
	// NoticeSignal is the signal (SIGUSR1, SIGUSR2, SIGTERM, SIGINT or SIGHUP; default
	// SIGUSR1) the member's process group gets with a notice.
	NoticeSignal string `json:"notice_signal,omitempty"`
	// YieldExitCode is the exit status by which a member yields after a notice (1..255, not
	// 78, which says a restart cannot help; default 75).
	YieldExitCode int `json:"yield_exit_code,omitempty"`
	// Image, when set, runs each member in a container of this image (pulled by the
	// machine's Docker Engine if it lacks it), through the Engine API on the member's
	// machine: the host's network (MASTER_ADDR and ports as for a process), the same
	// environment, the placed GPUs as device requests where they are real, the notice file
	// mounted read-only at the same path. Command is then run in the image (its PATH, its
	// working directory).
	Image string `json:"image,omitempty"`
	// Mounts are host directories or files given to a container member, each
	// HOST:CONTAINER or HOST:CONTAINER:ro with absolute paths (datasets, a checkpoint
	// directory). Only with Image.
	Mounts []string `json:"mounts,omitempty"`
}

// validImage checks an image reference: [registry/]name[:tag][@digest], no spaces.
func validImage(ref string) bool {
	if ref == "" || len(ref) > 255 || strings.HasPrefix(ref, "-") {
		return false
	}
	for _, r := range ref {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("._-/:@", r):
		default:
			return false
		}
	}
	return true
}

// normalize fills the defaults and validates the spec of gang name.
func (p *ProcessSpec) normalize(name string) error {
	if len(p.Command) == 0 || p.Command[0] == "" {
		return fmt.Errorf("%w: process gang %q has no command: want the executable and its arguments", ErrInvalid, name)
	}
	for _, kv := range p.Env {
		k, _, ok := strings.Cut(kv, "=")
		switch {
		case !ok || k == "" || strings.ContainsAny(k, " \t\n"):
			return fmt.Errorf("%w: process gang %q env %q: want NAME=value", ErrInvalid, name, kv)
		case strings.HasPrefix(k, "ATOLL_"):
			return fmt.Errorf("%w: process gang %q env %q: ATOLL_ variables are the agent's to set", ErrInvalid, name, kv)
		}
		for _, n := range processEnvNames {
			if k == n {
				return fmt.Errorf("%w: process gang %q env %q: %s is the agent's to set (see docs/process-gangs.md)", ErrInvalid, name, kv, k)
			}
		}
	}
	sig := strings.ToUpper(p.NoticeSignal)
	if sig != "" && !strings.HasPrefix(sig, "SIG") {
		sig = "SIG" + sig
	}
	if sig == "" {
		sig = DefaultNoticeSignal
	}
	known := false
	for _, s := range noticeSignals {
		known = known || s == sig
	}
	if !known {
		return fmt.Errorf("%w: process gang %q notice signal %q: want one of %s", ErrInvalid, name, p.NoticeSignal, strings.Join(noticeSignals, ", "))
	}
	p.NoticeSignal = sig
	if p.Image != "" && !validImage(p.Image) {
		return fmt.Errorf("%w: process gang %q image %q: want an image reference ([registry/]name[:tag][@digest])", ErrInvalid, name, p.Image)
	}
	if len(p.Mounts) > 0 && p.Image == "" {
		return fmt.Errorf("%w: process gang %q has mounts but no image: mounts are a container's", ErrInvalid, name)
	}
	for _, m := range p.Mounts {
		parts := strings.Split(m, ":")
		if len(parts) < 2 || len(parts) > 3 || !strings.HasPrefix(parts[0], "/") || !strings.HasPrefix(parts[1], "/") || (len(parts) == 3 && parts[2] != "ro" && parts[2] != "rw") {
			return fmt.Errorf("%w: process gang %q mount %q: want HOST:CONTAINER or HOST:CONTAINER:ro, absolute paths", ErrInvalid, name, m)
		}
	}
	switch {
	case p.YieldExitCode == 0:
		p.YieldExitCode = DefaultYieldExitCode
	case p.YieldExitCode < 1 || p.YieldExitCode > 255 || p.YieldExitCode == ExitPermanent:
		return fmt.Errorf("%w: process gang %q yield exit code %d: want 1..255, not %d (a permanent failure)", ErrInvalid, name, p.YieldExitCode, ExitPermanent)
	}
	return nil
}

// ProcessNotice is the JSON file (at ATOLL_NOTICE_FILE) a process gang's members find a
// notice in, written before the signal is sent, atomically (a rename).
type ProcessNotice struct {
	// Kind is preempt, drain, time_limit, shrink or grow.
	Kind NoticeKind `json:"kind"`
	// Issued is when the head gave it; Deadline when it acts alone (a stop loses the work
	// since the checkpoint; zero for a grow, which has none).
	Issued   time.Time `json:"issued"`
	Deadline time.Time `json:"deadline,omitzero"`
	// Generation is the gang generation it is given to; YieldExitCode the status to exit
	// with once checkpointed.
	Generation    int    `json:"generation"`
	YieldExitCode int    `json:"yield_exit_code"`
	Reason        string `json:"reason,omitempty"`
	// From and To are a resize's sizes.
	From int `json:"from,omitempty"`
	To   int `json:"to,omitempty"`
}

// Exits of a process gang's member that are not failures (Worker.Exit).
const (
	// ExitCompleted: the member exited with status 0.
	ExitCompleted = "completed"
	// ExitYielded: the member exited with its yield code after a notice.
	ExitYielded = "yielded"
)
