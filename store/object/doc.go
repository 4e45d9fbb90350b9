// Package object is one machine's object store: immutable objects in shared
// memory that worker processes map read-only, reference counts with owners and
// leases, and a cold tier (zstd-compressed spill files) with LRU eviction.
//
// A get copies nothing: View.Bytes is a read-only mapping of the store's own
// shared-memory pages. Large objects have a file each under /dev/shm (recycled
// after free, so a steady stream of same-sized puts runs at memcpy speed); small
// ones share slab files. Admission never overcommits: a put that does not fit
// spills least-recently-used unpinned objects, waits until its context's deadline,
// or fails with ErrStoreFull / ErrTooLarge / ErrDiskFull.
//
//	st, err := object.Open(object.DefaultConfig(), "/var/lib/atoll/store")
//	id, err := st.Put(ctx, "driver", tensorBytes) // one reference, owned by "driver"
//	v, err := st.Get(ctx, id)                      // pinned, zero-copy
//	use(v.Bytes())
//	v.Release()
//	err = st.Release(ctx, id, "driver")            // last reference: freed everywhere
//
// A worker process on the same machine asks the agent for st.Map(ctx, id, worker)
// and maps the bytes itself with MapFile. It puts without a copy too: the agent
// calls st.CreateFor(ctx, owner, worker, id, size) and hands the worker
// w.Mapping(); the worker writes through MapFileRW, and the agent seals. A holder (a worker process, or an
// in-process actor) that calls st.Renew(holder) while it lives has a lease; the
// reaper started by st.StartLeaseReaper(ctx, interval) (transfer.StartNode starts
// one) expires leases by the store's Clock, so a dead holder's references and
// mappings are released without anyone remembering to do it.
//
// Writers that fill an object in place (the transfer plane) use Create, then
// Writer.Seal or Abort. A second Create of an id still being written fails with
// ErrPending; st.Await(ctx, id, holder) waits for the writer and then takes a
// reference for holder, so concurrent fetches of one object make one copy.
//
// Open adopts only a new, empty or already-marked store directory
// (ErrNotStoreDir otherwise) and locks it (ErrDirInUse). Hot objects live in a
// shared-memory directory that names and is locked by its owner; Open reclaims
// the ones dead processes left (Reclaim), and shrinks the hot tier to the
// shared memory actually free.
//
// Metadata goes through the Directory interface (MemDirectory here; the metadata
// log implements it), under the caller's context. Counters are registered on
// Config.Registerer.
package object
