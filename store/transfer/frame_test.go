package transfer

import (
	"bytes"
	"errors"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	frames := []Frame{
		{Type: FrameHello, Version: 1, Nonce: [32]byte{1, 2}},
		{Type: FrameChallenge, Nonce: [32]byte{3}, MAC: [32]byte{4}},
		{Type: FrameAuth, MAC: [32]byte{5}},
		{Type: FrameAuthOK},
		{Type: FrameOpen, ReqID: 9, Object: [32]byte{6}},
		{Type: FrameOpened, ReqID: 9, Key: Key{7}, Size: 1 << 40, Fingerprint: 0xfeed},
		{Type: FrameRead, ReqID: 10, Key: Key{8}, Off: 123, Len: 456},
		{Type: FrameChunk, ReqID: 10, Fingerprint: 0xbeef, Len: 456},
		{Type: FrameClose, Key: Key{9}},
		{Type: FrameError, ReqID: 11, Code: CodeBadKey, Msg: "no such key"},
		{Type: FramePing, ReqID: 12},
		{Type: FramePong, ReqID: 12},
	}
	for _, f := range frames {
		b := AppendFrame(nil, &f)
		var buf []byte
		got, err := ReadFrame(bytes.NewReader(b), &buf)
		if err != nil || got != f {
			t.Errorf("type %d: got %+v, %v", f.Type, got, err)
		}
	}
}

func TestFrameDecodeErrors(t *testing.T) {
	read := AppendFrame(nil, &Frame{Type: FrameRead, Len: 10})
	tests := []struct {
		name string
		in   []byte
	}{
		{"truncated length", []byte{0, 0}},
		{"zero length", []byte{0, 0, 0, 0}},
		{"oversized", []byte{0, 0, 0x10, 0x01, 1}},
		{"truncated body", read[:len(read)-3]},
		{"short body for type", append([]byte{0, 0, 0, 3, byte(FrameRead)}, 1, 2)},
		{"long body for type", append([]byte{0, 0, 0, 2, byte(FrameAuthOK)}, 1)},
		{"unknown type", []byte{0, 0, 0, 1, 200}},
		{"zero type", []byte{0, 0, 0, 1, 0}},
		{"chunk too long", AppendFrame(nil, &Frame{Type: FrameChunk, Len: MaxChunk + 1})},
	}
	for _, tc := range tests {
		var buf []byte
		_, err := ReadFrame(bytes.NewReader(tc.in), &buf)
		if !errors.Is(err, ErrBadFrame) {
			t.Errorf("%s: %v, want ErrBadFrame", tc.name, err)
		}
	}
}

// FuzzReadFrame: any byte string either decodes to a frame that re-encodes to the
// same bytes, or is rejected with ErrBadFrame (or EOF when empty); never a panic.
func FuzzReadFrame(f *testing.F) {
	f.Add(AppendFrame(nil, &Frame{Type: FrameRead, ReqID: 1, Off: 5, Len: 9}))
	f.Add(AppendFrame(nil, &Frame{Type: FrameError, ReqID: 2, Code: 3, Msg: "x"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var buf []byte
		fr, err := ReadFrame(bytes.NewReader(b), &buf)
		if err != nil {
			if len(b) >= 4 && !errors.Is(err, ErrBadFrame) {
				t.Fatalf("error not ErrBadFrame: %v", err)
			}
			return
		}
		again := AppendFrame(nil, &fr)
		if !bytes.Equal(again, b[:len(again)]) {
			t.Fatalf("re-encoding differs: %x vs %x", again, b[:len(again)])
		}
	})
}
