// Package scenariotest holds the longest tests of the atoll command: the scheduler's
// demo scenarios (preempt, elastic, a drain, autoscale) on clusters of processes. They
// are a test binary of their own, beside cmd/atoll's, so that each package's tests stay
// within go test's default 10 minutes on a busy 2-core machine (issue 28). The package
// has no code.
package scenariotest
