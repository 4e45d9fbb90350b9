package runtime

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// storePlane moves ring chunks through the machines' object stores: the sender puts its
// chunk into its machine's shared memory as a scratch object; the receiver reads it in
// place when on the same machine (no copy) or pulls it over the transfer plane, then frees it.
type storePlane struct {
	l        *Local
	owner    string
	machines []int // by rank
}

// RingPlane returns the ChunkPlane for a gang whose rank r runs on machines[r]. Chunks are
// scratch objects owned by ScratchOwnerPrefix+name.
func (l *Local) RingPlane(name string, machines []int) ChunkPlane {
	return &storePlane{l: l, owner: ScratchOwnerPrefix + name, machines: machines}
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
	return p.l.obj.free(ctx, oid)
}
