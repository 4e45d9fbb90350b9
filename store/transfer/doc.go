// Package transfer is the data plane between object stores: pull-based, chunked,
// pipelined and checksummed, behind an RDMA-shaped API (register a region, get a
// key, read a range remotely by key).
//
// Only the TCP backend is built: DetectRDMA reports the machine's RDMA devices
// (through Mellanox/rdmamap), but no machine here has an RDMA NIC, so there is no
// verbs backend to test.
//
// Serving: a Server authenticates peers (HMAC challenge/response over the shared
// cluster token, inside mutual TLS when ServerConfig.TLS is set), registers a
// region per Open and serves reads by key only; chunk bytes go from the mapped
// object straight to the socket (writev, or sendfile from the shared-memory file
// with ServerConfig.Sendfile), preceded by their xxhash64.
//
//	srv, _ := transfer.NewServer(transfer.ServerConfig{Token: tok, ...}, transfer.StoreSource{Store: st})
//	addr, _ := srv.Listen("0.0.0.0:7070") // or srv.Serve(ln); use addr as the store's Config.Location
//	defer srv.Shutdown(ctx)
//
// Pulling: Client.Pull writes chunks straight into the new object's shared memory,
// several in flight over several connections, re-fetches a chunk whose fingerprint
// does not match, adapts the chunk size to the measured RTT and bandwidth, and
// moves on to the next location if a source dies (ErrObjectLost when none is left).
// Pulls of the same object into the same store are single-flight: later callers
// wait for the pull in progress (or take over if it fails) and get a reference of
// their own, instead of copying the object again or failing with "already exists".
// A Client keeps a few authenticated connections per server between pulls
// (health-checked with Ping, evicted when broken or idle), so a small pull costs
// no dial and no handshake; Client.Close closes them.
//
//	cl, _ := transfer.NewClient(cfg)
//	err := cl.Pull(ctx, st, id, meta.Locations, transfer.PullOptions{Owner: "worker-3"})
//
// A Node (StartNode) bundles a store, its server and its client; Node.Get is the
// SDK's get, and the node expires dead holders' leases (Store.StartLeaseReaper).
//
// Broadcast sends one object to many stores through a pipeline or tree in which
// every receiver serves what it has received so far to its children.
package transfer
