package runtime

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/atoll-run/atoll/store/object"
)

// storePlane moves ring chunks through the machines' object stores: the sender puts its
// chunk into its machine's shared memory as a scratch object; the receiver reads it in
// place when on the same machine (no copy) or pulls it over the transfer plane, then frees it.
type storePlane struct {
	l        *Local
	owner    string
	machines []int // by rank

	mu       sync.Mutex
	inFlight map[object.ID]bool // sent, not yet received
	released bool               // the ring was aborted: no more sends
}

// RingPlane returns the ChunkPlane for a gang whose rank r runs on machines[r]. Chunks are
// scratch objects owned by ScratchOwnerPrefix+name.
func (l *Local) RingPlane(name string, machines []int) ChunkPlane {
	return &storePlane{l: l, owner: ScratchOwnerPrefix + name, machines: machines, inFlight: map[object.ID]bool{}}
}

// floatBytes views a float32 slice as its bytes (little-endian on the machines Atoll runs on).
func floatBytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), len(f)*4)
}

// bytesFloats views bytes as float32s when aligned, and copies otherwise.
func bytesFloats(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func (p *storePlane) machine(rank int) (int, error) {
	if rank < 0 || rank >= len(p.machines) {
		return 0, fmt.Errorf("%w: rank %d of %d", ErrInvalidRequest, rank, len(p.machines))
	}
	return p.machines[rank], nil
}

func (p *storePlane) Send(ctx context.Context, from int, chunk []float32) (ChunkHandle, error) {
	m, err := p.machine(from)
	if err != nil {
		return ChunkHandle{}, err
	}
	id, err := p.l.obj.put(ctx, m, p.owner, floatBytes(chunk))
	if err != nil {
		return ChunkHandle{}, err
	}
	p.mu.Lock()
	if p.released {
		p.mu.Unlock()
		_ = p.l.obj.free(ctx, id)
		return ChunkHandle{}, ErrAborted
	}
	p.inFlight[id] = true
	p.mu.Unlock()
	return ChunkHandle{ID: ObjectID(id.String()), N: len(chunk)}, nil
}

func (p *storePlane) Recv(ctx context.Context, to int, h ChunkHandle, use func([]float32)) error {
	m, err := p.machine(to)
	if err != nil {
		return err
	}
	oid, err := parseObjectID(h.ID)
	if err != nil {
		return err
	}
	v, err := p.l.obj.get(ctx, m, oid)
	if err != nil {
		return err
	}
	if got := len(v.Bytes()); got != 4*h.N {
		v.Release()
		return fmt.Errorf("runtime: ring chunk %s has %d bytes, want %d", h.ID, got, 4*h.N)
	}
	use(bytesFloats(v.Bytes()))
	v.Release()
	p.mu.Lock()
	_, mine := p.inFlight[oid]
	delete(p.inFlight, oid)
	p.mu.Unlock()
	if !mine { // Release freed it already
		return nil
	}
	return p.l.obj.free(ctx, oid)
}

// Release frees the chunks that were sent but will never be received (the ring was
// aborted), so an aborted collective leaves nothing behind in the stores.
func (p *storePlane) Release(ctx context.Context) error {
	p.mu.Lock()
	ids := make([]object.ID, 0, len(p.inFlight))
	for id := range p.inFlight {
		ids = append(ids, id)
	}
	p.inFlight = map[object.ID]bool{}
	p.released = true
	p.mu.Unlock()
	var errs []error
	for _, id := range ids {
		if err := p.l.obj.free(ctx, id); err != nil && !errors.Is(err, ErrUnknownObject) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
