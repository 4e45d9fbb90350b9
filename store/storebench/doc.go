// Package storebench measures the object store and the transfer plane against
// baselines taken in the same run: memcpy, reading a plain buffer, and a bare
// single-stream loopback TCP copy. `atoll bench store` prints its Result.
//
//	res, err := storebench.Run(ctx, storebench.Config{MaxSize: 64 << 20,
//		ServeCmd: []string{exe, "store-serve"}}, logger)
//
// The pull is measured between two processes: ServeCmd starts the serving side
// (Serve, behind `atoll store-serve`), which prints one JSON line with its
// addresses and the object id, then serves until its stdin closes.
package storebench
