package codec

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/proto/actorspb"
)

type step struct {
	Gen  int
	Step int64
	Tags map[string][]float64
	Next *step
}

type noData struct{}

type hidden struct {
	Visible int
	secret  string
}

type withFunc struct{ F func() }

type withAny struct{ V any }

type stamped struct {
	At   time.Time
	Took time.Duration
}

func TestRoundTripKinds(t *testing.T) {
	c := New()
	if err := c.Register(step{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Register(stamped{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Register(noData{}); err != nil {
		t.Fatal(err)
	}
	for _, v := range []any{
		nil, 42, "hi", []byte{1, 2, 3}, []float32{1.5, -2, 3e7}, noData{},
		stamped{At: time.Unix(1700000000, 5).UTC(), Took: time.Second},
		step{Gen: 2, Step: 7, Tags: map[string][]float64{"a": {1, 2}}, Next: &step{Gen: 1}},
		&actorspb.Error{Code: actorspb.ErrorCode_STALE, Message: "x"},
	} {
		got, err := c.RoundTrip(v)
		if err != nil {
			t.Fatalf("%T: %v", v, err)
		}
		if pv, ok := v.(*actorspb.Error); ok {
			if g := got.(*actorspb.Error); g.Code != pv.Code || g.Message != pv.Message {
				t.Fatalf("proto round trip: %v", g)
			}
			continue
		}
		if !reflect.DeepEqual(got, v) {
			t.Fatalf("round trip of %#v gave %#v", v, got)
		}
	}
}

func TestUnserializableTypesNameTheField(t *testing.T) {
	c := New()
	for _, tc := range []struct {
		v    any
		want string
	}{
		{hidden{}, "hidden.secret is unexported"},
		{withFunc{}, "withFunc.F is a func"},
		{withAny{}, "withAny.V is an interface"},
		{make(chan int), "is a chan"},
	} {
		if err := c.Register(tc.v); !errors.Is(err, ErrUnserializable) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Register(%T) = %v; want ErrUnserializable mentioning %q", tc.v, err, tc.want)
		}
		if _, err := c.Encode(tc.v); !errors.Is(err, ErrUnserializable) {
			t.Errorf("Encode(%T) = %v; want ErrUnserializable", tc.v, err)
		}
	}
}

func TestUnregisteredTypeIsRefusedAtTheReceiver(t *testing.T) {
	sender, receiver := New(), New()
	p, err := sender.Encode(step{Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := receiver.Decode(p); !errors.Is(err, ErrUnknownType) || !strings.Contains(err.Error(), "codec.step") {
		t.Fatalf("decode of an unregistered type: %v", err)
	}
	// A typed reply needs no registration.
	var s step
	if err := DecodeInto(p, &s); err != nil || s.Gen != 1 {
		t.Fatalf("DecodeInto: %+v %v", s, err)
	}
	var wrong int
	if err := DecodeInto(p, &wrong); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "want int") {
		t.Fatalf("DecodeInto a wrong type: %v", err)
	}
}

func TestCorruptPayloads(t *testing.T) {
	c := New()
	_ = c.Register(step{})
	for _, p := range []*actorspb.Payload{
		nil,
		{Type: TypeName(reflect.TypeOf(step{})), Codec: actorspb.Codec_GOB, Data: []byte{0xff, 0x00, 0x13}},
		{Type: "[]float32", Codec: actorspb.Codec_RAW_F32, Data: []byte{1, 2, 3}},
		{Type: "atoll.nosuch.Message", Codec: actorspb.Codec_PROTO},
		{Type: TypeName(reflect.TypeOf(step{})), Codec: actorspb.Codec(99)},
	} {
		if _, err := c.Decode(p); err == nil {
			t.Errorf("Decode(%v) succeeded", p)
		}
	}
}

func FuzzDecode(f *testing.F) {
	c := New()
	_ = c.Register(step{})
	for _, v := range []any{step{Gen: 1, Tags: map[string][]float64{"x": {1}}}, 7, "s", []float32{1}} {
		p, _ := c.Encode(v)
		f.Add(p.Type, int32(p.Codec), p.Data)
	}
	f.Fuzz(func(t *testing.T, typ string, codec int32, data []byte) {
		_, _ = c.Decode(&actorspb.Payload{Type: typ, Codec: actorspb.Codec(codec), Data: data})
	})
}
