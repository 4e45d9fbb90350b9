package main

import "github.com/spf13/cobra"

// newRootCmd builds the command tree. Each command lives in its own file.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "atoll",
		Short:         "Atoll: a runtime for distributed GPU training in Go",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	bench := &cobra.Command{
		Use:   "bench",
		Short: "Run a benchmark against its baseline, measured in the same run",
	}
	bench.AddCommand(
		newBenchActorsCmd(),
		newBenchMetaCmd(),
		newBenchSchedCmd(),
		newBenchStoreCmd(),
		newBenchTopologyCmd(),
	)
	root.AddCommand(
		bench,
		newDemoCmd(),
		newHeadCmd(),
		newSimCmd(),
		newStoreServeCmd(),
		newTopologyCmd(),
	)
	return root
}
