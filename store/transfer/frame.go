package transfer

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/atoll-run/atoll/store/object"
)

// Wire format. Every frame is
//
//	length u32 (big endian, of what follows) | type u8 | fields
//
// Control frames are at most MaxFrame bytes. A Chunk frame is followed by Len raw
// data bytes that are not part of the frame, so the receiver can read them straight
// into their destination and the sender can write them straight from the mapped
// region. Frames are hand-encoded rather than protobuf because the chunk path must
// not allocate or copy.

// FrameType tags a frame.
type FrameType uint8

// Frame types.
const (
	FrameHello     FrameType = 1 + iota // client -> server: Version, Nonce
	FrameChallenge                      // server -> client: Nonce, MAC (server proves the token)
	FrameAuth                           // client -> server: MAC (client proves the token)
	FrameAuthOK                         // server -> client
	FrameOpen                           // client -> server: ReqID, Object
	FrameOpened                         // server -> client: ReqID, Key, Size, Fingerprint
	FrameRead                           // client -> server: ReqID, Key, Off, Len
	FrameChunk                          // server -> client: ReqID, Fingerprint, Len; then Len bytes
	FrameClose                          // client -> server: Key
	FrameError                          // server -> client: ReqID, Code, Msg
	FramePing                           // client -> server: ReqID (a pooled connection's health check)
	FramePong                           // server -> client: ReqID
	frameMax
)

// MaxFrame bounds a control frame's length field.
const MaxFrame = 4096

// MaxChunk bounds the data after a Chunk frame and the length of a Read.
const MaxChunk = 64 << 20

// ProtocolVersion is sent in Hello. Version 2 added Ping and Pong.
const ProtocolVersion = 2

// KeySize is the length of a region key.
const KeySize = 24

// Key names a registered region: an 8-byte handle and a 16-byte random secret.
// Holding the key is what authorizes reading the region, as an RDMA rkey does.
type Key [KeySize]byte

// ErrCode is the code of an Error frame.
type ErrCode uint16

// Error codes.
const (
	CodeInternal ErrCode = 1 + iota
	CodeBadKey
	CodeNotFound
	CodeRange
	CodeLost
	CodeBadFrame
	CodeDenied
)

// Frame is a decoded frame; which fields matter depends on Type.
type Frame struct {
	Type        FrameType
	Version     uint16
	Nonce       [32]byte
	MAC         [32]byte
	ReqID       uint64
	Object      object.ID
	Key         Key
	Size        int64
	Fingerprint uint64
	Off         int64
	Len         uint32
	Code        ErrCode
	Msg         string
}

// AppendFrame appends f's encoding, length prefix included, to b.
func AppendFrame(b []byte, f *Frame) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0, byte(f.Type))
	be := binary.BigEndian
	switch f.Type {
	case FrameHello:
		b = be.AppendUint16(b, f.Version)
		b = append(b, f.Nonce[:]...)
	case FrameChallenge:
		b = append(b, f.Nonce[:]...)
		b = append(b, f.MAC[:]...)
	case FrameAuth:
		b = append(b, f.MAC[:]...)
	case FrameAuthOK:
	case FrameOpen:
		b = be.AppendUint64(b, f.ReqID)
		b = append(b, f.Object[:]...)
	case FrameOpened:
		b = be.AppendUint64(b, f.ReqID)
		b = append(b, f.Key[:]...)
		b = be.AppendUint64(b, uint64(f.Size))
		b = be.AppendUint64(b, f.Fingerprint)
	case FrameRead:
		b = be.AppendUint64(b, f.ReqID)
		b = append(b, f.Key[:]...)
		b = be.AppendUint64(b, uint64(f.Off))
		b = be.AppendUint32(b, f.Len)
	case FrameChunk:
		b = be.AppendUint64(b, f.ReqID)
		b = be.AppendUint64(b, f.Fingerprint)
		b = be.AppendUint32(b, f.Len)
	case FrameClose:
		b = append(b, f.Key[:]...)
	case FramePing, FramePong:
		b = be.AppendUint64(b, f.ReqID)
	case FrameError:
		b = be.AppendUint64(b, f.ReqID)
		b = be.AppendUint16(b, uint16(f.Code))
		msg := f.Msg
		if len(msg) > MaxFrame-16 {
			msg = msg[:MaxFrame-16]
		}
		b = append(b, msg...)
	}
	be.PutUint32(b[start:], uint32(len(b)-start-4))
	return b
}

// fixed body sizes (after the type byte); FrameError has a variable tail.
var bodySize = [frameMax]int{
	FrameHello:     2 + 32,
	FrameChallenge: 64,
	FrameAuth:      32,
	FrameAuthOK:    0,
	FrameOpen:      8 + 32,
	FrameOpened:    8 + KeySize + 16,
	FrameRead:      8 + KeySize + 8 + 4,
	FrameChunk:     8 + 8 + 4,
	FrameClose:     KeySize,
	FrameError:     8 + 2,
	FramePing:      8,
	FramePong:      8,
}

// DecodeFrame decodes one frame body (the bytes after the length prefix).
func DecodeFrame(body []byte) (Frame, error) {
	var f Frame
	if len(body) == 0 {
		return f, fmt.Errorf("transfer: decode frame: empty: %w", ErrBadFrame)
	}
	t := FrameType(body[0])
	if t == 0 || t >= frameMax {
		return f, fmt.Errorf("transfer: decode frame: unknown type %d: %w", body[0], ErrBadFrame)
	}
	p := body[1:]
	want := bodySize[t]
	if len(p) < want || (t != FrameError && len(p) != want) {
		return f, fmt.Errorf("transfer: decode frame type %d: %d body bytes, want %d: %w", t, len(p), want, ErrBadFrame)
	}
	f.Type = t
	be := binary.BigEndian
	switch t {
	case FrameHello:
		f.Version = be.Uint16(p)
		copy(f.Nonce[:], p[2:])
	case FrameChallenge:
		copy(f.Nonce[:], p)
		copy(f.MAC[:], p[32:])
	case FrameAuth:
		copy(f.MAC[:], p)
	case FrameOpen:
		f.ReqID = be.Uint64(p)
		copy(f.Object[:], p[8:])
	case FrameOpened:
		f.ReqID = be.Uint64(p)
		copy(f.Key[:], p[8:])
		f.Size = int64(be.Uint64(p[8+KeySize:]))
		f.Fingerprint = be.Uint64(p[16+KeySize:])
		if f.Size < 0 {
			return f, fmt.Errorf("transfer: decode opened: negative size: %w", ErrBadFrame)
		}
	case FrameRead:
		f.ReqID = be.Uint64(p)
		copy(f.Key[:], p[8:])
		f.Off = int64(be.Uint64(p[8+KeySize:]))
		f.Len = be.Uint32(p[16+KeySize:])
		if f.Off < 0 || f.Len > MaxChunk {
			return f, fmt.Errorf("transfer: decode read: offset %d length %d: %w", f.Off, f.Len, ErrBadFrame)
		}
	case FrameChunk:
		f.ReqID = be.Uint64(p)
		f.Fingerprint = be.Uint64(p[8:])
		f.Len = be.Uint32(p[16:])
		if f.Len > MaxChunk {
			return f, fmt.Errorf("transfer: decode chunk: length %d > %d: %w", f.Len, MaxChunk, ErrBadFrame)
		}
	case FrameClose:
		copy(f.Key[:], p)
	case FramePing, FramePong:
		f.ReqID = be.Uint64(p)
	case FrameError:
		f.ReqID = be.Uint64(p)
		f.Code = ErrCode(be.Uint16(p[8:]))
		f.Msg = string(p[10:])
	}
	return f, nil
}

// ReadFrame reads one length-prefixed frame from r, using *buf as scratch.
func ReadFrame(r io.Reader, buf *[]byte) (Frame, error) {
	if cap(*buf) < MaxFrame+4 {
		*buf = make([]byte, MaxFrame+4)
	}
	b := (*buf)[:4]
	if _, err := io.ReadFull(r, b); err != nil {
		if err == io.ErrUnexpectedEOF {
			return Frame{}, fmt.Errorf("transfer: read frame: truncated length: %w", ErrBadFrame)
		}
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(b)
	if n == 0 || n > MaxFrame {
		return Frame{}, fmt.Errorf("transfer: read frame: length %d outside 1..%d: %w", n, MaxFrame, ErrBadFrame)
	}
	b = (*buf)[:n]
	if _, err := io.ReadFull(r, b); err != nil {
		return Frame{}, fmt.Errorf("transfer: read frame: truncated body (%d bytes): %v: %w", n, err, ErrBadFrame)
	}
	return DecodeFrame(b)
}
