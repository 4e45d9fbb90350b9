package main

import (
	"context"
	"fmt"
	"os"

	"github.com/atoll-run/atoll/internal/digits"
	"github.com/atoll-run/atoll/sdk"
)

func main() {
	if sdk.InWorker() { // an agent started this program as one of the job's workers
		os.Exit(sdk.WorkerMain(digits.Kinds()...))
	}
	o := digits.DefaultOptions()
	o.Progress = os.Stderr
	res, err := digits.Run(context.Background(), o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "digits:", err)
		os.Exit(1)
	}
	fmt.Printf("final loss %.4f (from %.4f), test accuracy %.2f%%, %d restart(s), %.1fs\n",
		res.FinalLoss, res.InitialLoss, 100*res.Accuracy, res.Restarts, res.WallSeconds)
}
