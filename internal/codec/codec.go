// Package codec turns the values actors exchange into bytes that cross a process boundary,
// and back. It is the one documented codec of Atoll:
//
//   - a protobuf message travels as itself (type = its full name; any message linked into
//     the binary decodes, nothing to register);
//   - []byte and []float32 travel raw;
//   - a value of a type with no data (struct{}) travels as its type name alone;
//   - any other Go value travels through encoding/gob, and its type must be registered
//     (Register) in the receiving process, because a receiver that gets an `any` must know
//     which type to make. Registration checks that the type can cross a process at all: no
//     funcs, channels, unsafe pointers or interface-typed fields, no unexported struct
//     fields (gob would silently drop them), so a program learns at start, not at the
//     first remote call, that a message cannot travel.
//
// The embedded default runs every value through Encode and Decode too, so a program that
// works on one process works on a cluster of processes.
//
// A Codec is safe for concurrent use.
package codec

import (
	"bytes"
	"encoding"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"sync"
	"unsafe"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/atoll-run/atoll/proto/actorspb"
)

// Errors of the codec. Check them with errors.Is.
var (
	// ErrUnserializable: a value or type cannot cross a process boundary.
	ErrUnserializable = errors.New("codec: value cannot cross a process boundary")
	// ErrUnknownType: a payload names a type this process has not registered.
	ErrUnknownType = errors.New("codec: unknown message type")
	// ErrCorrupt: a payload's bytes do not decode as its type.
	ErrCorrupt = errors.New("codec: payload does not decode")
)

// Codec encodes and decodes payloads; it holds the registry of Go types that may arrive as
// `any`.
type Codec struct {
	mu    sync.RWMutex
	types map[string]reflect.Type
}

// New returns a codec with the common built-in types registered (bool, the integer and
// float kinds, string, and slices and string-keyed maps of those).
func New() *Codec {
	c := &Codec{types: map[string]reflect.Type{}}
	for _, v := range []any{
		false, 0, int8(0), int16(0), int32(0), int64(0), uint(0), uint8(0), uint16(0), uint32(0), uint64(0),
		float32(0), float64(0), "", []int{}, []int64{}, []float64{}, []string{}, []bool{},
		map[string]string{}, map[string]int{}, map[string]float64{}, map[string][]byte{},
	} {
		_ = c.Register(v)
	}
	return c
}

// TypeName is the name a payload carries for a Go type: package path and name for named
// types, Go's spelling for the others.
func TypeName(t reflect.Type) string {
	if t.Name() != "" && t.PkgPath() != "" {
		return t.PkgPath() + "." + t.Name()
	}
	return t.String()
}

// Register makes the type of v decodable as `any` in this process. It fails with
// ErrUnserializable, naming the field, when the type cannot cross a process boundary.
// Registering a type twice is not an error. Protobuf messages, []byte and []float32 need
// no registration.
func (c *Codec) Register(v any) error {
	if v == nil {
		return fmt.Errorf("%w: Register(nil)", ErrUnserializable)
	}
	t := reflect.TypeOf(v)
	if _, ok := v.(proto.Message); ok {
		return nil
	}
	if err := Check(t); err != nil {
		return err
	}
	c.mu.Lock()
	c.types[TypeName(t)] = t
	c.mu.Unlock()
	return nil
}

// Types lists the registered type names, sorted.
func (c *Codec) Types() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]string, 0, len(c.types))
	for n := range c.types {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Check reports, with ErrUnserializable and the path of the offending field, whether values
// of type t can cross a process boundary through this codec.
func Check(t reflect.Type) error {
	return check(t, TypeName(t), map[reflect.Type]bool{})
}

var (
	protoMessage = reflect.TypeOf((*proto.Message)(nil)).Elem()
	gobEncoder   = reflect.TypeOf((*gob.GobEncoder)(nil)).Elem()
	binMarshaler = reflect.TypeOf((*encoding.BinaryMarshaler)(nil)).Elem()
)

var protoTypes sync.Map // reflect.Type -> bool

// isProto reports, cached per type, whether t is a protobuf message.
func isProto(t reflect.Type) bool {
	if v, ok := protoTypes.Load(t); ok {
		return v.(bool)
	}
	is := t.Implements(protoMessage)
	protoTypes.Store(t, is)
	return is
}

// selfEncoding reports whether gob encodes t through the type's own methods (time.Time and
// the like), so its unexported fields do not matter.
func selfEncoding(t reflect.Type) bool {
	for _, i := range []reflect.Type{gobEncoder, binMarshaler} {
		if t.Implements(i) || reflect.PointerTo(t).Implements(i) {
			return true
		}
	}
	return false
}

func check(t reflect.Type, path string, seen map[reflect.Type]bool) error {
	if seen[t] {
		return nil
	}
	seen[t] = true
	if t.Implements(protoMessage) || selfEncoding(t) {
		return nil
	}
	switch t.Kind() {
	case reflect.Func, reflect.Chan, reflect.UnsafePointer, reflect.Uintptr:
		return fmt.Errorf("%w: %s is a %s", ErrUnserializable, path, t.Kind())
	case reflect.Interface:
		return fmt.Errorf("%w: %s is an interface (%s): the receiver could not know which type to make; use a concrete type", ErrUnserializable, path, t)
	case reflect.Complex64, reflect.Complex128:
		return nil
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return check(t.Elem(), path+"[]", seen)
	case reflect.Map:
		if err := check(t.Key(), path+"[key]", seen); err != nil {
			return err
		}
		return check(t.Elem(), path+"[value]", seen)
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() {
				return fmt.Errorf("%w: %s.%s is unexported: it would not cross a process boundary (export it, or keep the value out of messages)", ErrUnserializable, path, f.Name)
			}
			if err := check(f.Type, path+"."+f.Name, seen); err != nil {
				return err
			}
		}
	}
	return nil
}

// empty reports whether values of t carry no data (struct{} and arrays of it).
func empty(t reflect.Type) bool {
	return t.Size() == 0 && t.Kind() != reflect.Slice && t.Kind() != reflect.Map
}

var (
	bytesType = reflect.TypeOf([]byte(nil))
	f32Type   = reflect.TypeOf([]float32(nil))
)

// Encode turns v into a payload. nil encodes as NIL. A Go value whose type fails Check is
// refused with ErrUnserializable (it need not be registered to be sent: only the receiver
// must know it).
func (c *Codec) Encode(v any) (*actorspb.Payload, error) {
	switch x := v.(type) {
	case nil:
		return &actorspb.Payload{Codec: actorspb.Codec_NIL}, nil
	case proto.Message:
		b, err := proto.Marshal(x)
		if err != nil {
			return nil, fmt.Errorf("%w: protobuf %s: %v", ErrUnserializable, proto.MessageName(x), err)
		}
		return &actorspb.Payload{Type: string(proto.MessageName(x)), Codec: actorspb.Codec_PROTO, Data: b}, nil
	case []byte:
		return &actorspb.Payload{Type: TypeName(bytesType), Codec: actorspb.Codec_RAW_BYTES, Data: x}, nil
	case []float32:
		return &actorspb.Payload{Type: TypeName(f32Type), Codec: actorspb.Codec_RAW_F32, Data: F32Bytes(x)}, nil
	}
	t := reflect.TypeOf(v)
	if err := c.checkCached(t); err != nil {
		return nil, err
	}
	name := TypeName(t)
	if empty(t) {
		return &actorspb.Payload{Type: name, Codec: actorspb.Codec_EMPTY}, nil
	}
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(v); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnserializable, name, err)
	}
	return &actorspb.Payload{Type: name, Codec: actorspb.Codec_GOB, Data: buf.Bytes()}, nil
}

// checkCached runs Check once per type (registered types passed it already).
func (c *Codec) checkCached(t reflect.Type) error {
	name := TypeName(t)
	c.mu.RLock()
	known, ok := c.types[name]
	c.mu.RUnlock()
	if ok && known == t {
		return nil
	}
	return Check(t)
}

// Decode turns a payload back into a value of the type it names. Go types other than
// []byte and []float32 must be registered (ErrUnknownType, naming the type, otherwise);
// protobuf messages must be linked into the binary.
func (c *Codec) Decode(p *actorspb.Payload) (any, error) {
	if p == nil {
		return nil, fmt.Errorf("%w: no payload", ErrCorrupt)
	}
	switch p.Codec {
	case actorspb.Codec_NIL:
		return nil, nil
	case actorspb.Codec_RAW_BYTES:
		return append([]byte(nil), p.Data...), nil
	case actorspb.Codec_RAW_F32:
		return BytesF32(p.Data)
	case actorspb.Codec_PROTO:
		mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(p.Type))
		if err != nil {
			return nil, fmt.Errorf("%w: protobuf message %q is not linked into this program", ErrUnknownType, p.Type)
		}
		m := mt.New().Interface()
		if err := proto.Unmarshal(p.Data, m); err != nil {
			return nil, fmt.Errorf("%w: protobuf %s: %v", ErrCorrupt, p.Type, err)
		}
		return m, nil
	}
	c.mu.RLock()
	t, ok := c.types[p.Type]
	c.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q is not registered in this process (register it with the actor kind that receives it)", ErrUnknownType, p.Type)
	}
	ptr := reflect.New(t)
	if err := decodeInto(p, t, ptr.Interface()); err != nil {
		return nil, err
	}
	return ptr.Elem().Interface(), nil
}

// DecodeInto decodes a payload into *dst, whose type the caller knows (a typed reply):
// nothing needs to be registered. A payload of another type is an error naming both.
func DecodeInto[T any](p *actorspb.Payload, dst *T) error {
	if p == nil {
		return fmt.Errorf("%w: no payload", ErrCorrupt)
	}
	var zero T
	t := reflect.TypeOf(&zero).Elem()
	if p.Codec == actorspb.Codec_NIL {
		*dst = zero
		return nil
	}
	if t.Kind() == reflect.Interface { // Call[any]: decode by the payload's own type
		return fmt.Errorf("%w: a reply into an interface type %s needs Codec.Decode", ErrUnknownType, t)
	}
	if p.Codec == actorspb.Codec_PROTO {
		if isProto(t) && t.Kind() == reflect.Pointer {
			m := reflect.New(t.Elem()).Interface().(proto.Message)
			if string(proto.MessageName(m)) != p.Type {
				return fmt.Errorf("%w: reply is %s, want %s", ErrCorrupt, p.Type, proto.MessageName(m))
			}
			if err := proto.Unmarshal(p.Data, m); err != nil {
				return fmt.Errorf("%w: protobuf %s: %v", ErrCorrupt, p.Type, err)
			}
			reflect.ValueOf(dst).Elem().Set(reflect.ValueOf(m))
			return nil
		}
		return fmt.Errorf("%w: reply is protobuf %s, want %s", ErrCorrupt, p.Type, TypeName(t))
	}
	if want := TypeName(t); p.Type != want {
		return fmt.Errorf("%w: reply is %s, want %s", ErrCorrupt, p.Type, want)
	}
	return decodeInto(p, t, dst)
}

func decodeInto(p *actorspb.Payload, t reflect.Type, dst any) error {
	switch p.Codec {
	case actorspb.Codec_EMPTY:
		return nil
	case actorspb.Codec_RAW_BYTES:
		b, ok := dst.(*[]byte)
		if !ok {
			return fmt.Errorf("%w: raw bytes into %s", ErrCorrupt, t)
		}
		*b = append([]byte(nil), p.Data...)
		return nil
	case actorspb.Codec_RAW_F32:
		f, ok := dst.(*[]float32)
		if !ok {
			return fmt.Errorf("%w: raw float32s into %s", ErrCorrupt, t)
		}
		v, err := BytesF32(p.Data)
		*f = v
		return err
	case actorspb.Codec_GOB:
		if err := gob.NewDecoder(bytes.NewReader(p.Data)).Decode(dst); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrCorrupt, p.Type, err)
		}
		return nil
	}
	return fmt.Errorf("%w: %s has unknown codec %v", ErrCorrupt, p.Type, p.Codec)
}

// RoundTrip encodes and decodes v, as crossing a process would; the embedded default sends
// every message through it so that what works in one process works across processes.
func (c *Codec) RoundTrip(v any) (any, error) {
	p, err := c.Encode(v)
	if err != nil {
		return nil, err
	}
	return c.Decode(p)
}

// F32Bytes copies float32s into little-endian bytes.
func F32Bytes(f []float32) []byte {
	out := make([]byte, 4*len(f))
	for i, x := range f {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

// BytesF32 decodes little-endian float32s.
func BytesF32(b []byte) ([]float32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%w: %d bytes is not a whole number of float32s", ErrCorrupt, len(b))
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out, nil
}

// F32View views a float32 slice as its bytes without copying (little-endian machines).
func F32View(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), len(f)*4)
}

// ViewF32 views bytes as float32s without copying when they are aligned, and copies
// otherwise.
func ViewF32(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
	}
	out, _ := BytesF32(b[:len(b)/4*4])
	return out
}
