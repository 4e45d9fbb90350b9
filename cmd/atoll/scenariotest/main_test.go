package scenariotest

import (
	"os"
	"testing"

	"github.com/atoll-run/atoll/cmd/atoll/internal/clustertest"
)

func TestMain(m *testing.M) { os.Exit(clustertest.Run(m)) }
