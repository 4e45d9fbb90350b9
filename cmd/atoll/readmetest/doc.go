// Package readmetest runs README.md's cluster section, line by line as a reader would, on
// a cluster of processes (TestREADMECluster, about a minute and a half on the 2-core
// project machine). It is a test binary of its own, as cmd/atoll/scenariotest is, so that
// cmd/atoll's tests stay well within go test's default 10 minutes on a busy machine: in
// CI's full run cmd/atoll took 510–543 s of 600 with it. The package has no code.
package readmetest
