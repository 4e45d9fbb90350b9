// Package meta is the cluster's metadata state machine on the Paxos log: nodes, jobs,
// gangs, placements, actors, objects and checkpoints, with versioned keys, compare-and-swap,
// transactions and watches.
//
// Records live under table prefixes (TableNodes.Key(id), TableObjects.Key(id), ...). Every
// write is a Request (compares + ops) applied atomically at one new revision; requests carry
// (ClientID, Seq) so a retried write takes effect once. Watch streams every change after a
// revision, in order. Snapshot/Restore capture the whole state with the dedup table.
//
// An embedded head (three in-process replicas, WALs in a temporary directory):
//
//	c, err := meta.StartCluster(meta.DefaultClusterConfig())
//	defer c.Close()
//	client, err := c.Client(meta.DefaultClientConfig())
//	rev, err := client.Put(ctx, meta.TableNodes.Key("n1"), []byte(`{"gpus":8}`))
//	ok, err := client.CAS(ctx, meta.TableJobs.Key("j1"), 0, spec) // create if absent
//	kv, found, err := client.Get(ctx, meta.TableNodes.Key("n1"))
//	events, err := c.SMs[1].Watch(ctx, string(meta.TableJobs), rev)
//
// Every key written belongs to a table; AllTables is the list. A separate process reaches
// an `atoll head` through HTTPConn (the Handler's client API), over mutual TLS with
// NewHTTPServer and NewHTTPClient given a *tls.Config.
package meta
