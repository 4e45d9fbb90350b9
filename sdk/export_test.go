package sdk

// SetCheckpointCommitHook sets what Checkpoint runs once a checkpoint's parts are durable,
// before its commit, and returns the function that unsets it.
func SetCheckpointCommitHook(f func(*Gang)) func() {
	checkpointCommitHook = f
	return func() { checkpointCommitHook = nil }
}
