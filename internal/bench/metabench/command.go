package metabench

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
)

// Command returns the benchmark as a command (`atoll bench meta`, and atoll-benchmeta with
// the etcd baseline): progress on stderr, the report or --json on stdout.
func Command(use, short string, baseline Baseline, baselineName string) *cobra.Command {
	cfg := DefaultConfig()
	cfg.Baseline, cfg.BaselineName = baseline, baselineName
	var asJSON bool
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := zap.NewDevelopment()
			if err != nil {
				return err
			}
			defer logger.Sync()
			cfg.Logger = logger.WithOptions(zap.IncreaseLevel(zap.InfoLevel))
			fmt.Fprintf(cmd.ErrOrStderr(), "bench meta: dir=%s duration=%v clients=%d seq-writes=%d value=%dB tls=%v baseline=%q (fsync on)\n",
				cfg.Dir, cfg.Duration, cfg.Clients, cfg.SeqWrites, cfg.ValueSize, cfg.TLS, cfg.BaselineName)
			res, err := Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			WriteReport(cmd.OutOrStdout(), cfg, res)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object on stdout")
	cfg.flags(cmd)
	return cmd
}
