package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run())
}

// run executes the command with a context that SIGINT or SIGTERM cancels, so that a
// command interrupted stops its processes and removes its temporary files and shared
// memory on its way out. A second signal ends the process at once (what it leaves, the
// next run reclaims: see object.Reclaim and the sdk's temporary directories).
func run() int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		s, ok := <-sigs
		if !ok {
			return
		}
		fmt.Fprintf(os.Stderr, "atoll: %v: stopping (again to quit at once)\n", s)
		cancel()
		if s, ok = <-sigs; ok {
			fmt.Fprintf(os.Stderr, "atoll: %v: quitting\n", s)
			os.Exit(130)
		}
	}()
	if err := newRootCmd().ExecuteContext(ctx); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "atoll: interrupted:", err)
			return 130
		}
		fmt.Fprintln(os.Stderr, "atoll:", err)
		return 1
	}
	return 0
}
