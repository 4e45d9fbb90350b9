// Package store is the benchmark harness behind `atoll bench store`: it
// measures the object store and the transfer plane against baselines taken in
// the same run (memcpy, reading a plain buffer, a bare single-stream loopback
// TCP copy; plain pulls for pulls over mutual TLS; a client that dials every
// pull for pooled connections). It is not product code: it lives under
// internal/ and only the CLI uses it.
//
//	res, err := store.Run(ctx, store.Config{MaxSize: 64 << 20,
//		ServeCmd: []string{exe, "store-serve"}}, logger)
//
// Pulls are measured between two processes: ServeCmd starts the serving side
// (Serve, behind `atoll store-serve`). It reads its configuration, the cluster
// token and TLS keys included, as one JSON line on its stdin (never from its
// command line, where ps shows it), prints one JSON line with its addresses and
// object ids, then serves until its stdin closes.
package store
