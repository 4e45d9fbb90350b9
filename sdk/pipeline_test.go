package sdk

import (
	"testing"
	"time"

	"github.com/atoll-run/atoll/proto/actorspb"
)

func TestTaskRequestWire(t *testing.T) {
	args := &actorspb.Payload{Type: "main.Args", Codec: actorspb.Codec_GOB, Data: []byte{1, 2, 3}}
	req := taskRequest("square.v2", args)
	name, got, ok := splitTaskRequest(req)
	if !ok || name != "square.v2" || got.Type != "main.Args" || got.Codec != actorspb.Codec_GOB || string(got.Data) != "\x01\x02\x03" {
		t.Fatalf("split(%q) = %q, %+v, %v", req.Type, name, got, ok)
	}
	if _, _, ok := splitTaskRequest(&actorspb.Payload{Type: "main.Other"}); ok {
		t.Fatal("a payload without a task name split as a task")
	}
}

// TestPipelineTo: a task is pipelined only to a busy worker with room that answered within
// the window and is not failing; the least busy first, the most recent answer among equals.
func TestPipelineTo(t *testing.T) {
	now := time.Unix(1000, 0)
	fresh, older, stale := now.Add(-time.Millisecond), now.Add(-2*time.Millisecond), now.Add(-pipelineWindow)
	type w struct {
		name     string
		inflight int
		progress time.Time
		failing  bool
	}
	for _, tc := range []struct {
		name    string
		workers []w
		want    string
	}{
		{"none", nil, ""},
		{"idle workers are not pipelined to (the idle list takes them)", []w{{"a", 0, fresh, false}}, ""},
		{"busy with room", []w{{"a", 1, fresh, false}}, "a"},
		{"full", []w{{"a", taskPipeline, fresh, false}}, ""},
		{"no answer within the window: long tasks", []w{{"a", 1, stale, false}}, ""},
		{"failing", []w{{"a", 1, fresh, true}}, ""},
		{"least busy", []w{{"a", 3, fresh, false}, {"b", 2, older, false}, {"c", taskPipeline, fresh, false}}, "b"},
		{"most recent answer among equals", []w{{"a", 2, older, false}, {"b", 2, fresh, false}}, "b"},
		{"skips the stale", []w{{"a", 1, stale, false}, {"b", 3, fresh, false}}, "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sh := &shape{slots: map[*slot]bool{}}
			names := map[*slot]string{}
			for _, x := range tc.workers {
				s := &slot{sh: sh, inflight: x.inflight, progress: x.progress, failing: x.failing}
				sh.slots[s] = true
				names[s] = x.name
			}
			got := sh.pipelineToLocked(now)
			if names[got] != tc.want {
				t.Fatalf("pipelined to %q, want %q", names[got], tc.want)
			}
		})
	}
}

// TestTaskPoolGrowsWhileItPays walks the pool's growth rule (wantLocked) through a clock
// of its own: one worker first; doubling while each step raises the rate at which tasks
// end; a ceiling where a step did not pay, then one worker at a time past it; nothing
// while the workers keep up, while workers start, or before a window has passed; and a
// worker for every task run from inside a task.
func TestTaskPoolGrowsWhileItPays(t *testing.T) {
	t0 := time.Unix(1000, 0)
	sh := &shape{slots: map[*slot]bool{}}
	wait := func(n int, pipelined bool) {
		sh.waiting, sh.nested = nil, 0
		if !pipelined {
			sh.nested = n
		}
		for range n {
			sh.waiting = append(sh.waiting, &waiter{pipelined: pipelined})
		}
	}
	workers := func(n int) {
		for len(sh.slots) < n {
			sh.slots[&slot{sh: sh, inflight: taskPipeline}] = true
		}
	}
	// window runs the tasks for d from now, all of it with tasks waiting, done of them
	// ending, and returns the time at its end.
	window := func(now time.Time, d time.Duration, done int) time.Time {
		sh.account(now)
		sh.done += done
		return now.Add(d)
	}
	want := func(now time.Time, w int, why string) {
		t.Helper()
		if got := sh.wantLocked(now); got != w {
			t.Fatalf("%s: want %d more workers, the rule says %d (ceiling %d, last rate %.0f)", why, w, got, sh.ceiling, sh.lastRate)
		}
	}

	wait(1000, true)
	want(t0, 1, "no worker yet: one, to learn what one costs")
	sh.spawning = 1
	want(t0, 0, "the first is starting: no other")
	sh.spawning, sh.startup = 0, 100*time.Millisecond
	workers(1)
	sh.decided = t0
	sh.restartWindow(t0)
	want(t0.Add(50*time.Millisecond), 0, "judged before a window passed")

	now := window(t0, 200*time.Millisecond, 200) // 1,000 tasks/s with one worker
	want(now, 1, "tasks waited all the window: double to 2")
	workers(2)
	sh.decided = now
	sh.restartWindow(now)
	now = window(now, 200*time.Millisecond, 400) // 2,000/s: it paid
	want(now, 2, "the step paid: double to 4")
	workers(4)
	sh.decided = now
	sh.restartWindow(now)
	now = window(now, 200*time.Millisecond, 420) // 2,100/s: 4 workers bought 5%
	want(now, 0, "the step did not pay")
	if sh.ceiling != 2 {
		t.Fatalf("ceiling %d after a step from 2 that did not pay, want 2", sh.ceiling)
	}
	now = window(now, 200*time.Millisecond, 420)
	want(now, 0, "at the ceiling")
	now = now.Add(ceilingHold)
	sh.decided = now.Add(-200 * time.Millisecond)
	sh.restartWindow(sh.decided)
	now = window(sh.decided, 200*time.Millisecond, 420)
	want(now, 1, "the ceiling's hold is over: probe one worker")

	// Long tasks after short ones: no task ends in a window while tasks wait. The ceiling
	// learned on the short ones does not hold, and no step is judged a failure.
	sh.ceiling, sh.ceilingAt = 2, now // 4 run
	sh.decided = now
	sh.restartWindow(now)
	now = window(now, 200*time.Millisecond, 0)
	want(now, 4, "no task ended: double past the ceiling")
	if sh.ceilingAt.Equal(now) {
		t.Fatal("a window in which no task ended set a ceiling")
	}

	// The workers keep up: tasks waited for a tenth of the window.
	sh.decided = now
	sh.restartWindow(now)
	sh.account(now.Add(20 * time.Millisecond)) // tasks waited 20 ms
	wait(0, true)
	now = now.Add(200 * time.Millisecond)
	sh.account(now) // and none for 180 ms
	wait(1000, true)
	want(now, 0, "tasks waited a tenth of the time")
	if sh.busy != 0 || !sh.window.Equal(now) {
		t.Fatalf("a window where the workers kept up was not closed: busy %v, window at %v", sh.busy, sh.window)
	}

	// Long tasks: none ends; the pool keeps growing.
	sh = &shape{slots: map[*slot]bool{}, startup: 100 * time.Millisecond}
	wait(100, true)
	workers(1)
	sh.decided = t0
	sh.restartWindow(t0)
	now = window(t0, 200*time.Millisecond, 0)
	want(now, 1, "long tasks: double")
	workers(2)
	sh.decided = now
	sh.restartWindow(now)
	now = window(now, 200*time.Millisecond, 0)
	want(now, 2, "long tasks: double again (a rate of 0 is no step that failed)")

	// Tasks run from inside tasks get a worker each, whatever the judgement.
	sh = &shape{slots: map[*slot]bool{}, startup: 100 * time.Millisecond}
	workers(3)
	wait(5, false)
	sh.decided = t0
	want(t0.Add(time.Millisecond), 5, "five tasks from inside tasks")
	sh.spawning = 5
	want(t0.Add(2*time.Millisecond), 0, "their workers are starting")
}

// TestGiveFreshWorkerOneTask: a worker that never answered takes one task of a burst (the
// others wait for the workers the pool starts), one that has just answered takes the
// pipelined tasks behind it up to taskPipeline, and a task run from inside a task is never
// pipelined behind another.
func TestGiveFreshWorkerOneTask(t *testing.T) {
	burst := func(n int, pipelined bool) *shape {
		sh := &shape{slots: map[*slot]bool{}}
		for range n {
			sh.enqueue(&waiter{ch: make(chan grant, 1), pipelined: pipelined}, time.Now())
		}
		return sh
	}
	p := &taskPool{}
	now := time.Now()
	for _, tc := range []struct {
		name      string
		progress  time.Time
		pipelined bool
		want      int
	}{
		{"never answered", time.Time{}, true, 1},
		{"answered long ago", now.Add(-time.Second), true, 1},
		{"just answered", now, true, taskPipeline},
		{"just answered, nested tasks", now, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sh := burst(40, tc.pipelined)
			s := &slot{sh: sh, progress: tc.progress}
			sh.slots[s] = true
			p.giveLocked(s)
			if s.inflight != tc.want || len(sh.waiting) != 40-tc.want {
				t.Fatalf("the worker took %d tasks (%d still wait), want %d", s.inflight, len(sh.waiting), tc.want)
			}
			if fresh := now.Sub(tc.progress) >= pipelineWindow; fresh && sh.pipelineToLocked(now) != nil {
				t.Fatal("a task is pipelined behind a worker that has not answered lately")
			}
		})
	}
}
