// Package meta is the client side of the cluster's metadata log: the records (nodes, jobs,
// gangs, placements, actors, objects and checkpoints under table prefixes), the requests
// and events, and the Client that finds the leader and retries. It imports no Paxos: a
// program that only talks to a cluster links this package, not the replicas. The state
// machine, the head's HTTP handler and an in-process cluster are in metaserver.
//
// Records live under table prefixes (TableNodes.Key(id), TableObjects.Key(id), ...). Every
// write is a Request (compares + ops) applied atomically at one new revision; requests carry
// (ClientID, Seq) so a retried write takes effect once.
//
// An embedded head (three in-process replicas, WALs in a temporary directory):
//
//	c, err := metaserver.StartCluster(metaserver.DefaultClusterConfig())
//	defer c.Close()
//	client, err := c.Client(meta.DefaultClientConfig())
//	rev, err := client.Put(ctx, meta.TableNodes.Key("n1"), []byte(`{"gpus":8}`))
//	ok, err := client.CAS(ctx, meta.TableJobs.Key("j1"), 0, spec) // create if absent
//	kv, found, err := client.Get(ctx, meta.TableNodes.Key("n1"))
//	events, err := c.SMs[1].Watch(ctx, string(meta.TableJobs), rev)
//
// Every key written belongs to a table; AllTables is the list. A separate process reaches
// an `atoll head` through HTTPConn (metaserver.Handler's client API), over mutual TLS with
// metaserver.NewHTTPServer and NewHTTPClient given a *tls.Config. A follower's answer is a
// *NotLeaderError naming the leader; the Client follows it.
package meta
