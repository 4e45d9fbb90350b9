// Command atoll is Atoll's command-line tool: it runs the demo training job, starts heads and
// agents, prints machine topology, runs the scheduler simulator and the benchmarks.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "atoll:", err)
		os.Exit(1)
	}
}
