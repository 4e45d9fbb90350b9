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
// and maps the bytes itself with MapFile; the agent calls st.Renew(worker) while
// the worker lives and st.ExpireLeases(now) periodically, so a dead worker's
// references and mappings are released.
//
// Metadata goes through the Directory interface (MemDirectory here; the metadata
// log implements it). Counters are registered on Config.Registerer.
package object
