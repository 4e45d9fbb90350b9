package object

import (
	"bytes"
	"testing"
)

// FuzzReadSpillHeader: any bytes either decode to a header that encodes back to
// the bytes it was read from, or are rejected with an error; never a panic or a
// huge allocation (the owner's length is 16 bits, the size is bounded).
func FuzzReadSpillHeader(f *testing.F) {
	f.Add(spillHeader{id: NewID(), size: 1 << 20, fp: 0xfeed, owner: "driver"}.marshal())
	f.Add(spillHeader{}.marshal())
	f.Add([]byte("ATOLSPL1"))
	f.Add(append(spillHeader{owner: "x"}.marshal()[:57], 0xff, 0xff))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := readSpillHeader(bytes.NewReader(b))
		if err != nil {
			return
		}
		if h.size < 0 || h.size > 1<<50 {
			t.Fatalf("accepted size %d", h.size)
		}
		again := h.marshal()
		if !bytes.Equal(again, b[:len(again)]) {
			t.Fatalf("re-encoding differs: %x vs %x", again, b[:len(again)])
		}
	})
}

func TestSpillHeaderRoundTrip(t *testing.T) {
	for _, h := range []spillHeader{
		{id: NewID(), size: 0, fp: 0, owner: ""},
		{id: NewID(), size: 1 << 40, fp: 1<<64 - 1, owner: "scratch/ring-3"},
	} {
		got, err := readSpillHeader(bytes.NewReader(h.marshal()))
		if err != nil || got != h {
			t.Errorf("%+v: got %+v, %v", h, got, err)
		}
	}
}
