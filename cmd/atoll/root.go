package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

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
		Args:  noSubcommand,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	bench.AddCommand(
		newBenchActorsCmd(),
		newBenchAutoscaleCmd(),
		newBenchCryptoCmd(),
		newBenchControlPlaneCmd(),
		newBenchActorsPeerCmd(),
		newBenchAllReduceCmd(),
		newBenchCollectivesCmd(),
		newBenchCollPeerCmd(),
		newBenchFailoverCmd(),
		newBenchGangStartCmd(),
		newBenchHollowAgentsCmd(),
		newBenchRayCmd(),
		newBenchRingPeerCmd(),
		newBenchScaleCmd(),
		newBenchMetaCmd(),
		newBenchSchedCmd(),
		newBenchStoreCmd(),
		newBenchTopologyCmd(),
		newBenchWorkerPutCmd(),
	)
	root.AddCommand(
		bench,
		newAddressCmd(),
		newAgentCmd(),
		newCACmd(),
		newCheckpointsCmd(),
		newDashboardCmd(),
		newDemoCmd(),
		newDownCmd(),
		newDrainCmd(),
		newUndrainCmd(),
		newEventsCmd(),
		newHeadCmd(),
		newInitCmd(),
		newKillWorkerCmd(),
		newLogsCmd(),
		newQueuesCmd(),
		newStatusCmd(),
		newSubmitCmd(),
		newUpCmd(),
		newSimCmd(),
		newTuneCmd(),
		newStoreServeCmd(),
		newTopologyCmd(),
		newTokenCmd(),
	)
	root.Args = noSubcommand
	root.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	return root
}

// noSubcommand refuses arguments that name no subcommand (`atoll bench nosuch` is an
// error, not the help and exit 0).
func noSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unknown command %q for %q (see %s --help)", args[0], cmd.CommandPath(), cmd.CommandPath())
	}
	return nil
}
