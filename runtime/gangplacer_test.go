package runtime

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/gang"
)

func TestGangPlacerPlacesThroughTheCore(t *testing.T) {
	c, err := LoadCluster("2xa100-pcie-nvlink-pairs") // 8 islands of 2 GPUs
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewGangPlacer(c, gang.DefaultConfig(), zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHead(c, p, NewMemMeta(), zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var islands = map[int]bool{}
	for i := 0; i < 8; i++ {
		pl, err := h.Admit(ctx, GangRequest{Job: "j", Gang: string(rune('a' + i)), Members: 2, GPUsPerMember: 1, SameIsland: true, AllReduceBytes: 1 << 20})
		if err != nil {
			t.Fatalf("gang %d: %v", i, err)
		}
		if pl.Placer != "gang" || len(pl.Islands) != 1 || islands[pl.Islands[0]] {
			t.Fatalf("gang %d: placer %s islands %v (used %v)", i, pl.Placer, pl.Islands, islands)
		}
		if _, ok := pl.Scores["topology"]; !ok {
			t.Fatalf("gang %d: no topology score in %v", i, pl.Scores)
		}
		islands[pl.Islands[0]] = true
	}
	if _, err := h.Admit(ctx, GangRequest{Job: "j", Gang: "late", Members: 1, GPUsPerMember: 1}); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("full cluster: %v", err)
	}
	if _, err := h.Admit(ctx, GangRequest{Job: "j", Gang: "wide", Members: 3, GPUsPerMember: 1, SameIsland: true}); !errors.Is(err, ErrNeverFits) {
		t.Fatalf("3 GPUs in an island of 2: %v", err)
	}
	// Releasing a gang gives its island back to the core, and the next gang gets it.
	if err := h.Release(ctx, "j", "c"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Admit(ctx, GangRequest{Job: "j", Gang: "again", Members: 2, GPUsPerMember: 1, SameIsland: true}); err != nil {
		t.Fatalf("after release: %v", err)
	}
}
