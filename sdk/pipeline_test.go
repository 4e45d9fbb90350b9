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
