package sim

import (
	"context"
	"errors"
	"time"
)

type DynamicOptions struct {
	MaxJobs      int
	Window       time.Duration
	PrioritySeed uint64
	Policies     []string
}
type Stats struct{ Mean, P50, P99 float64 }
type DynamicResult struct {
	Policy             string
	UtilPct            float64
	QueueDelay         Stats
	HighPrioQueueDelay Stats
	JCT                Stats
	AllReduce          Stats
	Preemptions        int
	LostGPUHours       float64
}

func RunDynamicFiles(ctx context.Context, jobs, cluster string, skipBad bool, sk *Skipper, opt DynamicOptions) ([]DynamicResult, error) {
	return nil, errors.New("todo")
}
