package sdk

import (
	"bytes"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/atoll-run/atoll/internal/codec"
	"github.com/atoll-run/atoll/proto/actorspb"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
)

// Ref is a typed reference to an immutable object in the cluster's object store. It is a
// small value that crosses process boundaries (pass it in messages and arguments).
type Ref[T any] struct {
	// ID is the object's id.
	ID string
	// Parts is 0 for an object stored whole; a large object (larger than its store can hold
	// at once) is stored in Parts parts, each of which the store may spill to disk, and ID
	// names the list of its parts.
	Parts int
}

// Host is where Put, Get and Free run: the driver (*Cluster) or an actor (*Context, on its
// machine's store).
type Host interface {
	conn() *conn
	store() objectHost
}

// objectHost is one process's access to its machine's object store.
type objectHost interface {
	put(ctx context.Context, data []byte) (object.ID, error)
	// putAs stores data held by another holder than this process (a gang's checkpoints,
	// which outlive the worker incarnation that wrote them; a task's results, which its job
	// owns).
	putAs(ctx context.Context, holder string, data []byte) (object.ID, error)
	// persist makes this store's copy of an object durable (fsync'd on this machine's
	// disk): a checkpoint's part, a detached object.
	persist(ctx context.Context, id object.ID) (api.ObjectInfo, error)
	// get returns the object's bytes: the store's shared memory itself when it is on this
	// machine (no copy), after a pull over the transfer plane otherwise. release once.
	get(ctx context.Context, id object.ID) ([]byte, func(), error)
	// free drops this machine's references to the object.
	free(ctx context.Context, id object.ID) error
	// location is the store's transfer address (its location in the directory).
	location() string
}

// ownedStore puts objects for another owner than the process (a task's job).
type ownedStore struct {
	objectHost
	holder string
}

func (s ownedStore) put(ctx context.Context, data []byte) (object.ID, error) {
	return s.putAs(ctx, s.holder, data)
}

// durableStore puts whole objects durably (Detached): the copy the store takes is
// persisted while a second durable copy is made (on another machine, or in the shared
// checkpoint directory), and the put returns once both are done.
type durableStore struct {
	objectHost
	c      *conn
	holder string
}

func (s durableStore) put(ctx context.Context, data []byte) (object.ID, error) {
	id, err := s.putAs(ctx, s.holder, data)
	if err != nil {
		return object.ID{}, err
	}
	if _, err := s.c.makeDurable(ctx, s.objectHost, id, s.location(), s.holder, -1); err != nil {
		_ = s.c.freeEverywhere(context.WithoutCancel(ctx), s.objectHost, id)
		return object.ID{}, err
	}
	return id, nil
}

// Owners of objects that are not a process: a job (what its tasks put) and nobody (a
// detached object).
const detachedOwner = "detached"

func jobOwner(job string) string { return "job/" + job }

// PutOption changes how Put stores an object.
type PutOption func(*putOptions)

type putOptions struct{ detached bool }

// Detached makes an object that belongs to no process: it outlives the driver, worker or
// job that put it, and goes only with Free. It is durable: Put returns once it is on disk
// (fsync'd) on two machines (or on one and the shared checkpoint directory), so it
// survives the restart of an agent, the loss of a machine and a restart of the cluster.
// Without it an object belongs to who put it: a driver's go when it disconnects, a
// worker's when its incarnation ends, a task's (and a task worker's) when its job stops;
// a Get of it after that fails with ErrOwnerDied.
func Detached() PutOption { return func(o *putOptions) { o.detached = true } }

// Put stores v as an immutable object and returns a typed reference to it. []byte and
// []float32 are stored raw; other types through encoding/gob (they must be able to cross a
// process boundary). Its metadata is committed to the cluster's log before Put returns. An
// object larger than its store can hold at once is stored in parts (each spilled to disk
// as the store fills) rather than refused.
func Put[T any](ctx context.Context, h Host, v T, opts ...PutOption) (Ref[T], error) {
	if err := ctx.Err(); err != nil {
		return Ref[T]{}, fmt.Errorf("sdk: put %T: %w", v, err)
	}
	var o putOptions
	for _, opt := range opts {
		opt(&o)
	}
	data, err := encodeValue(v)
	if err != nil {
		return Ref[T]{}, fmt.Errorf("sdk: put %T: %w", v, err)
	}
	st := h.store()
	if o.detached {
		if st, err = h.conn().detachedStore(ctx); err != nil {
			return Ref[T]{}, fmt.Errorf("sdk: put %T: %w", v, err)
		}
		st = durableStore{objectHost: st, c: h.conn(), holder: detachedOwner}
	}
	id, parts, err := putData(ctx, st, data)
	if err != nil {
		return Ref[T]{}, fmt.Errorf("sdk: put %T (%d bytes): %w", v, len(data), err)
	}
	return Ref[T]{ID: id.String(), Parts: parts}, nil
}

// Get fetches the object behind r (pulling it to this machine when it is elsewhere) and
// decodes it.
func Get[T any](ctx context.Context, h Host, r Ref[T]) (T, error) {
	var v T
	b, release, err := getData(ctx, sharedFallback{h.store(), h.conn()}, r.ID, r.Parts)
	if err != nil {
		return v, err
	}
	defer release()
	if r.Parts > 0 { // b is this call's own assembled copy
		if p, ok := any(&v).(*[]byte); ok {
			*p = b
			return v, nil
		}
	}
	if err := decodeValue(b, &v); err != nil {
		return v, fmt.Errorf("sdk: get %s as %T: %w", r.ID, v, err)
	}
	return v, nil
}

// View lends the raw bytes of an object without copying them when it is on this machine
// (the store's shared memory, mapped read-only): a large tensor is read in place. Call
// release once, and do not use the bytes after. An object stored in parts is assembled
// into one copy. codec-free views of []float32 objects: ViewFloat32.
func View[T any](ctx context.Context, h Host, r Ref[T]) (data []byte, release func(), err error) {
	return getData(ctx, sharedFallback{h.store(), h.conn()}, r.ID, r.Parts)
}

// ViewFloat32 views a []float32 object in place (no copy when it is on this machine and
// aligned, which the store's objects are). Call release once, and do not use the slice
// after.
func ViewFloat32(ctx context.Context, h Host, r Ref[[]float32]) ([]float32, func(), error) {
	b, release, err := View(ctx, h, r)
	if err != nil {
		return nil, nil, err
	}
	if len(b)%4 != 0 {
		release()
		return nil, nil, fmt.Errorf("sdk: view %s: %d bytes is not a whole number of float32s", r.ID, len(b))
	}
	return codec.ViewF32(b), release, nil
}

// Free drops the object everywhere: every store that holds a copy lets it go (a copy still
// being read goes when its reader is done).
func Free[T any](ctx context.Context, h Host, r Ref[T]) error {
	id, err := object.ParseID(r.ID)
	if err != nil {
		return fmt.Errorf("%w: %q: %v", ErrUnknownObject, r.ID, err)
	}
	c := h.conn()
	if r.Parts > 0 {
		ids, _, err := readManifest(ctx, h.store(), id)
		if err != nil {
			return objectErr(r.ID, err)
		}
		var errs []error
		for _, p := range ids {
			if err := c.freeEverywhere(ctx, h.store(), p); err != nil && !errors.Is(err, ErrUnknownObject) {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	return c.freeEverywhere(ctx, h.store(), id)
}

// partSize is the largest part a large object is cut into; smaller when the store is.
const partSize = 64 << 20

// putData stores data whole, or in parts when the store can never hold it at once: it
// returns the object's id (or its manifest's) and the number of parts.
func putData(ctx context.Context, st objectHost, data []byte) (object.ID, int, error) {
	id, err := st.put(ctx, data)
	if err == nil || !errors.Is(err, object.ErrTooLarge) {
		return id, 0, err
	}
	for size := min(partSize, len(data)/2); size >= 1<<20; size /= 2 {
		ids, err := putParts(ctx, st, data, size)
		if errors.Is(err, object.ErrTooLarge) {
			continue
		}
		if err != nil {
			return object.ID{}, 0, err
		}
		man := manifest{Size: int64(len(data))}
		for _, p := range ids {
			man.Parts = append(man.Parts, p.String())
		}
		b, _ := json.Marshal(man)
		mid, err := st.put(ctx, b)
		if err != nil {
			freeParts(st, ids)
			return object.ID{}, 0, err
		}
		return mid, len(ids), nil
	}
	return object.ID{}, 0, err
}

// manifest lists the parts of an object stored in parts.
type manifest struct {
	Size  int64    `json:"size"`
	Parts []string `json:"parts"`
}

func putParts(ctx context.Context, st objectHost, data []byte, size int) ([]object.ID, error) {
	var ids []object.ID
	for off := 0; off < len(data); off += size {
		id, err := st.put(ctx, data[off:min(off+size, len(data))])
		if err != nil {
			freeParts(st, ids)
			return nil, fmt.Errorf("part at byte %d: %w", off, err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func freeParts(st objectHost, ids []object.ID) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, id := range ids {
		_ = st.free(ctx, id)
	}
}

func readManifest(ctx context.Context, st objectHost, id object.ID) ([]object.ID, int64, error) {
	b, release, err := st.get(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	defer release()
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, 0, fmt.Errorf("sdk: object %s is not a list of parts: %w", id.Short(), err)
	}
	ids := make([]object.ID, len(m.Parts))
	for i, p := range m.Parts {
		if ids[i], err = object.ParseID(p); err != nil {
			return nil, 0, fmt.Errorf("sdk: object %s part %d: %w", id.Short(), i, err)
		}
	}
	return ids, m.Size, nil
}

// getData returns an object's bytes: lent by the store for a whole object, assembled into
// a fresh buffer for one stored in parts.
func getData(ctx context.Context, st objectHost, ref string, parts int) ([]byte, func(), error) {
	id, err := object.ParseID(ref)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %q: %v", ErrUnknownObject, ref, err)
	}
	if parts == 0 {
		b, release, err := st.get(ctx, id)
		if err != nil {
			return nil, nil, objectErr(ref, err)
		}
		return b, release, nil
	}
	ids, size, err := readManifest(ctx, st, id)
	if err != nil {
		return nil, nil, objectErr(ref, err)
	}
	out := make([]byte, 0, size)
	for i, p := range ids {
		b, release, err := st.get(ctx, p)
		if err != nil {
			return nil, nil, objectErr(ref, fmt.Errorf("part %d of %d: %w", i, len(ids), err))
		}
		out = append(out, b...)
		release()
	}
	return out, func() {}, nil
}

func objectErr(id string, err error) error {
	switch {
	case errors.Is(err, object.ErrOwnerDied):
		return fmt.Errorf("%w (%w): %s: %v", ErrOwnerDied, ErrUnknownObject, id, err)
	case errors.Is(err, object.ErrLost), errors.Is(err, transfer.ErrObjectLost):
		return fmt.Errorf("%w: %s: %v", ErrObjectLost, id, err)
	case errors.Is(err, object.ErrNotFound):
		return fmt.Errorf("%w: %s: %v", ErrUnknownObject, id, err)
	}
	return err
}

func encodeValue(v any) ([]byte, error) {
	switch x := v.(type) {
	case []byte:
		return x, nil
	case []float32:
		return codec.F32Bytes(x), nil
	}
	if err := codec.Check(reflect.TypeOf(v)); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func decodeValue(data []byte, v any) error {
	switch x := v.(type) {
	case *[]byte:
		*x = append([]byte(nil), data...)
		return nil
	case *[]float32:
		f, err := codec.BytesF32(data)
		*x = f
		return err
	}
	return gob.NewDecoder(bytes.NewReader(data)).Decode(v)
}

// decodePayload decodes constructor arguments into *T.
func decodePayload[T any](p *api.Payload, dst *T) error {
	return codec.DecodeInto(&actorspb.Payload{Type: p.Type, Codec: actorspb.Codec(p.Codec), Data: p.Data}, dst)
}

func encodePayload(c *codec.Codec, v any) (*api.Payload, error) {
	if v == nil {
		return nil, nil
	}
	p, err := c.Encode(v)
	if err != nil {
		return nil, err
	}
	return &api.Payload{Type: p.Type, Codec: int32(p.Codec), Data: p.Data}, nil
}

type agentObjectRef = api.ObjectRef

// localStore is a store in this process: the embedded default's machines, and a driver's
// own store on a cluster.
type localStore struct {
	l      *objects.Local
	holder string
}

func (s localStore) put(ctx context.Context, data []byte) (object.ID, error) {
	return s.l.Put(ctx, s.holder, data)
}

func (s localStore) putAs(ctx context.Context, holder string, data []byte) (object.ID, error) {
	return s.l.Put(ctx, holder, data)
}

func (s localStore) persist(ctx context.Context, id object.ID) (api.ObjectInfo, error) {
	m, err := s.l.Persist(ctx, id)
	if err != nil {
		return api.ObjectInfo{}, err
	}
	return api.ObjectInfo{ID: id.String(), Size: m.Size, Fingerprint: m.Fingerprint, Durable: true, Location: s.l.Node.Addr}, nil
}

func (s localStore) get(ctx context.Context, id object.ID) ([]byte, func(), error) {
	v, err := s.l.Get(ctx, id, s.holder)
	if err != nil {
		return nil, nil, err
	}
	return v.Bytes(), v.Release, nil
}

func (s localStore) free(ctx context.Context, id object.ID) error { return s.l.Free(ctx, id) }
func (s localStore) location() string                             { return s.l.Node.Addr }

// unwritten reports whether id's record still waits in this store's group-commit queue
// with this store as its only location.
func (s localStore) unwritten(id object.ID) bool {
	d, ok := s.l.Node.Store.Directory().(*objects.Directory)
	return ok && d.Unwritten(id, s.location())
}

// agentStore is a worker process's access to its machine's store, through its agent: a
// small put sends the bytes to the agent, a large one writes them straight into the
// store's shared memory (putDirect; one copy either way, as into any store), a get maps
// the store's shared memory read-only (no copy).
type agentStore struct {
	url, token, holder, transfer string
	hc                           *http.Client
	// sameMachine: the store is this process's machine's (a worker's own agent), so a
	// large put may write its shared memory itself (putDirect).
	sameMachine bool

	mu    sync.Mutex
	files map[string]*object.WritableFile // segments mapped writable for puts (putDirect)
}

func (s *agentStore) call(ctx context.Context, path string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := s.hc.Do(req)
	if err != nil {
		return fmt.Errorf("sdk: agent %s: %w", s.url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		var eb api.ErrorBody
		_ = json.Unmarshal(data, &eb)
		switch eb.Kind {
		case "not_found":
			return fmt.Errorf("%s: %w", eb.Error, object.ErrNotFound)
		case api.KindTooLarge:
			return fmt.Errorf("%s: %w", eb.Error, object.ErrTooLarge)
		case api.KindOwnerDied:
			return fmt.Errorf("%s: %w", eb.Error, object.ErrOwnerDied)
		case api.KindObjectLost:
			return fmt.Errorf("%s: %w", eb.Error, object.ErrLost)
		}
		return fmt.Errorf("sdk: agent %s%s: %d: %s", s.url, path, resp.StatusCode, eb.Error)
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

func (s *agentStore) put(ctx context.Context, data []byte) (object.ID, error) {
	return s.putAs(ctx, s.holder, data)
}

// directPutMin is the size from which a worker process writes an object straight into
// its machine's shared memory (create, map, copy, seal) instead of sending it to the
// agent: below it one request carrying the bytes costs less than two and a mapping.
const directPutMin = 256 << 10

func (s *agentStore) putAs(ctx context.Context, holder string, data []byte) (object.ID, error) {
	if s.sameMachine && len(data) >= directPutMin {
		return s.putDirect(ctx, holder, data)
	}
	var ref api.ObjectRef
	if err := s.call(ctx, "/v1/objects/put?holder="+url.QueryEscape(holder), bytes.NewReader(data), &ref); err != nil {
		return object.ID{}, err
	}
	return object.ParseID(ref.ID)
}

// putDirect writes data straight into the machine's shared memory: the agent admits
// the room (a segment of its own, which maps no other object), this process copies the
// bytes in through its writable mapping (the put's one copy) and asks for the seal, which
// commits the object's metadata as any put's. The agent keeps a freed segment for the
// process that wrote it, so this process keeps its mappings (writable) and maps each
// segment once: repeated puts of like sizes (checkpoints) cost the copy and two requests.
// A failure between create and seal gives the room back; if this process dies in
// between, its lease does.
func (s *agentStore) putDirect(ctx context.Context, holder string, data []byte) (object.ID, error) {
	var cw api.ObjectWrite
	q := url.Values{"holder": {holder}, "lease": {s.holder}, "size": {strconv.Itoa(len(data))}}
	if err := s.call(ctx, "/v1/objects/create?"+q.Encode(), nil, &cw); err != nil {
		return object.ID{}, err
	}
	ref, _ := json.Marshal(api.ObjectRef{ID: cw.ID, Holder: holder})
	abort := func(err error) (object.ID, error) {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = s.call(actx, "/v1/objects/abort", bytes.NewReader(ref), nil)
		return object.ID{}, err
	}
	b, err := s.writable(cw)
	if err != nil {
		return abort(fmt.Errorf("sdk: put %d bytes in place: %w", len(data), err))
	}
	object.Copy(b, data)
	if err := s.call(ctx, "/v1/objects/seal", bytes.NewReader(ref), nil); err != nil {
		return abort(err)
	}
	return object.ParseID(cw.ID)
}

// writable returns the writable bytes of a create's answer, mapping its segment unless
// this process has it mapped already, after unmapping the segments the agent dropped.
func (s *agentStore) writable(cw api.ObjectWrite) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.files == nil {
		s.files = map[string]*object.WritableFile{}
	}
	for _, p := range cw.Unmap {
		if f := s.files[p]; f != nil {
			_ = f.Close()
			delete(s.files, p)
		}
	}
	m := object.Mapping{Path: cw.Path, Offset: cw.Offset, Size: cw.Size}
	if f := s.files[cw.Path]; f != nil {
		if b, ok := f.Range(m); ok {
			return b, nil
		}
		_ = f.Close()
		delete(s.files, cw.Path)
	}
	f, err := object.MapWritable(cw.Path)
	if err != nil {
		return nil, err
	}
	b, ok := f.Range(m)
	if !ok {
		_ = f.Close()
		return nil, fmt.Errorf("%s holds no bytes [%d, +%d)", cw.Path, cw.Offset, cw.Size)
	}
	s.files[cw.Path] = f
	return b, nil
}

func (s *agentStore) persist(ctx context.Context, id object.ID) (api.ObjectInfo, error) {
	body, _ := json.Marshal(api.ObjectRef{ID: id.String(), Holder: s.holder})
	var in api.ObjectInfo
	if err := s.call(ctx, "/v1/objects/persist", bytes.NewReader(body), &in); err != nil {
		return api.ObjectInfo{}, err
	}
	if in.Location == "" {
		in.Location = s.transfer
	}
	return in, nil
}

func (s *agentStore) get(ctx context.Context, id object.ID) ([]byte, func(), error) {
	body, _ := json.Marshal(api.ObjectRef{ID: id.String(), Holder: s.holder})
	var m object.Mapping
	if err := s.call(ctx, "/v1/objects/map", bytes.NewReader(body), &m); err != nil {
		return nil, nil, err
	}
	b, unmap, err := object.MapFile(m)
	if err != nil {
		return nil, nil, err
	}
	var once sync.Once
	return b, func() {
		once.Do(func() {
			_ = unmap()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = s.call(ctx, "/v1/objects/unmap", bytes.NewReader(body), nil)
		})
	}, nil
}

func (s *agentStore) free(ctx context.Context, id object.ID) error {
	body, _ := json.Marshal(api.ObjectRef{ID: id.String()})
	return s.call(ctx, "/v1/objects/free", bytes.NewReader(body), nil)
}

func (s *agentStore) location() string { return s.transfer }

// renew keeps the worker's lease on its references and mappings while it lives.
func (s *agentStore) renew(ctx context.Context, every time.Duration) {
	body, _ := json.Marshal(api.ObjectRef{Holder: s.holder})
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, every)
		_ = s.call(rctx, "/v1/leases/renew", bytes.NewReader(body), nil)
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
