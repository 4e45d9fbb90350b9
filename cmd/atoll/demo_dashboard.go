package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/atoll-run/atoll/internal/digits"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/sdk"
)

// demoWatch is what `atoll demo` adds to the training for the dashboard: it prints the
// dashboard's address once the gang is placed (--dashboard), reports each step's loss to
// the leader (Gang.Report, on the embedded default as on a cluster of processes), and
// keeps the cluster up after training until Ctrl-C or --linger (--dashboard on the
// embedded default, whose cluster ends with the demo).
type demoWatch struct {
	out       io.Writer
	dashboard bool
	linger    time.Duration
	gang      *sdk.Gang
	reports   chan api.Progress
	done      chan struct{}
}

func (w *demoWatch) hooks() digits.Hooks {
	return digits.Hooks{Started: w.started, Step: w.step, Finished: w.finished}
}

func (w *demoWatch) started(ctx context.Context, c *sdk.Cluster, _ string, gang *sdk.Gang) {
	w.gang = gang
	if w.dashboard {
		st, err := c.Status(ctx)
		switch {
		case err != nil:
			fmt.Fprintf(w.out, "dashboard: the cluster's status: %v\n", err)
		case st.Dashboard == "":
			fmt.Fprintln(w.out, "dashboard: this cluster's heads serve none")
		default:
			fmt.Fprintf(w.out, "dashboard: %s\n", st.Dashboard)
		}
	}
	w.reports, w.done = make(chan api.Progress, 256), make(chan struct{})
	go w.report(context.WithoutCancel(ctx))
}

// report sends the progress reports in order; one that fails is dropped (the dashboard
// misses a point, the training goes on).
func (w *demoWatch) report(ctx context.Context) {
	defer close(w.done)
	for p := range w.reports {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = w.gang.Report(rctx, p.Step, p.Metrics)
		cancel()
	}
}

func (w *demoWatch) step(step int64, loss float64) {
	if w.reports == nil {
		return
	}
	select {
	case w.reports <- api.Progress{Step: step, Metrics: map[string]float64{"loss": loss}}:
	default: // the head is slow: drop this point rather than slow the training
	}
}

func (w *demoWatch) finished(ctx context.Context) {
	if w.reports != nil {
		close(w.reports)
		<-w.done
		w.reports = nil
	}
	if !w.dashboard {
		return
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if w.linger > 0 {
		fmt.Fprintf(w.out, "training done; the dashboard stays up for %v (Ctrl-C ends it)\n", w.linger)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.linger)
		defer cancel()
	} else {
		fmt.Fprintln(w.out, "training done; the dashboard stays up until Ctrl-C")
	}
	<-ctx.Done()
}
