package sdk

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/gob"
	"fmt"
	"math"

	"github.com/atoll-run/atoll/runtime"
)

// Ref is a typed reference to an immutable object in the cluster's object store.
type Ref[T any] struct {
	// ID is the object's id.
	ID runtime.ObjectID
}

// Host is where Put and Get run: the driver (*Cluster, on the first machine) or a worker
// (*Context, on the worker's machine).
type Host interface {
	host() (l *runtime.Local, machine int, owner string)
}

func (c *Cluster) host() (*runtime.Local, int, string) { return c.local, 0, "driver" }

// Put stores v as an immutable object and returns a typed reference to it. []byte and
// []float32 are stored raw; other types with encoding/gob.
func Put[T any](ctx context.Context, h Host, v T) (Ref[T], error) {
	data, err := encode(v)
	if err != nil {
		return Ref[T]{}, fmt.Errorf("sdk: put %T: %w", v, err)
	}
	l, machine, owner := h.host()
	id, err := l.PutObject(ctx, machine, owner, data)
	return Ref[T]{ID: id}, err
}

// Get fetches the object behind r (pulling it to this machine if needed) and decodes it.
func Get[T any](ctx context.Context, h Host, r Ref[T]) (T, error) {
	var v T
	l, machine, _ := h.host()
	view, release, err := l.GetObject(ctx, machine, r.ID)
	if err != nil {
		return v, err
	}
	defer release()
	if err := decode(view, &v); err != nil {
		return v, fmt.Errorf("sdk: get %s as %T: %w", r.ID, v, err)
	}
	return v, nil
}

// Free drops the object everywhere.
func Free[T any](ctx context.Context, h Host, r Ref[T]) error {
	l, _, _ := h.host()
	return l.FreeObject(ctx, r.ID)
}

func encode(v any) ([]byte, error) {
	switch x := v.(type) {
	case []byte:
		return x, nil
	case []float32:
		out := make([]byte, 4*len(x))
		for i, f := range x {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
		}
		return out, nil
	}
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func decode(data []byte, v any) error {
	switch x := v.(type) {
	case *[]byte:
		*x = append([]byte(nil), data...)
		return nil
	case *[]float32:
		if len(data)%4 != 0 {
			return fmt.Errorf("%d bytes is not a whole number of float32s", len(data))
		}
		out := make([]float32, len(data)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		*x = out
		return nil
	}
	return gob.NewDecoder(bytes.NewReader(data)).Decode(v)
}
