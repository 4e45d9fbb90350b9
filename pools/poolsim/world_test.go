package poolsim

import (
	"testing"
	"time"

	"github.com/atoll-run/atoll/pools"
)

// TestCheckpointOnRequest: a checkpoint asked for with a deadline keeps all the work when it
// can be written in time, and is lost when it cannot (the job falls back to its last
// periodic checkpoint); either way the job goes back to the queue, and a restart pays the
// restore.
func TestCheckpointOnRequest(t *testing.T) {
	const every = 30 * time.Minute
	cases := []struct {
		name     string
		gbPerGPU float64 // at 2 GB/s on 8 GPUs: 10 -> 40 s, 40 -> 160 s
		window   time.Duration
		kept     time.Duration // progress kept at 45 min of work
		saved    int
		missed   int
	}{
		{name: "fits the notice window: all work kept", gbPerGPU: 10, window: 2 * time.Minute, kept: 45 * time.Minute, saved: 1},
		{name: "does not fit: back to the periodic checkpoint", gbPerGPU: 40, window: 2 * time.Minute, kept: every, missed: 1},
		{name: "exactly fits", gbPerGPU: 30, window: 2 * time.Minute, kept: 45 * time.Minute, saved: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			set := testSet(t, 2, 0, 0)
			opt := DefaultOptions()
			opt.Checkpoint.GBPerGPU = c.gbPerGPU
			w := newWorld([]Job{{ID: "j", Submit: 0, Duration: 10 * time.Hour, GPUs: 8}}, set, opt, idleScaler{})
			runUntil(t, w, 0) // the arrival
			mi := readyMachine(w, poolOf(t, set, pools.Spot))
			w.place()
			j := w.jobs[0]
			if j.started != 0 {
				t.Fatalf("job not placed: %+v", j)
			}
			runUntil(t, w, 45*time.Minute)
			w.now = 45 * time.Minute
			w.drain(mi) // as a notice does: the job is not placed there again
			w.checkpointStop(0, w.now+c.window)
			runUntil(t, w, w.now+10*time.Minute)
			if j.started >= 0 || len(w.pending) != 1 {
				t.Fatalf("job still running (started %v) or not queued (%v)", j.started, w.pending)
			}
			if j.progress != c.kept {
				t.Errorf("kept %v of work, want %v", j.progress, c.kept)
			}
			if w.res.CheckpointsSaved != c.saved || w.res.CheckpointsMissed != c.missed {
				t.Errorf("checkpoints saved %d missed %d, want %d and %d", w.res.CheckpointsSaved, w.res.CheckpointsMissed, c.saved, c.missed)
			}
			// Placed again: the restart pays the restore (start-up plus reading it back).
			readyMachine(w, poolOf(t, set, pools.Spot))
			w.place()
			want := opt.Restore + opt.Checkpoint.Time(8)
			if j.started < 0 || j.runRestore != want {
				t.Errorf("restart: started %v, restore %v, want %v", j.started, j.runRestore, want)
			}
		})
	}
}

// TestKillKeepsPeriodicCheckpoint: a job whose machine is taken without a checkpoint keeps
// its newest periodic checkpoint, and a restore in progress keeps what it restores.
func TestKillKeepsPeriodicCheckpoint(t *testing.T) {
	set := testSet(t, 2, 0, 0)
	opt := DefaultOptions()
	w := newWorld([]Job{{ID: "j", Submit: 0, Duration: 10 * time.Hour, GPUs: 4}}, set, opt, idleScaler{})
	runUntil(t, w, 0)
	mi := readyMachine(w, poolOf(t, set, pools.Spot))
	w.place()
	runUntil(t, w, 70*time.Minute)
	w.now = 70 * time.Minute
	w.terminate(mi)
	j := w.jobs[0]
	if j.progress != time.Hour || !j.hasCkpt {
		t.Fatalf("kept %v (checkpoint %v), want the 60-minute periodic checkpoint", j.progress, j.hasCkpt)
	}
	// Placed again and killed during its restore: the checkpoint is still what it has.
	readyMachine(w, poolOf(t, set, pools.Spot))
	w.place()
	w.now += 30 * time.Second
	w.kill(0)
	if j.progress != time.Hour {
		t.Fatalf("kept %v after a kill during the restore, want 1h", j.progress)
	}
}
