package transfer

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"time"
)

// Mutual challenge/response over a shared cluster token: the client sends a nonce,
// the server answers with its own nonce and an HMAC proving it knows the token,
// the client answers with an HMAC over both nonces. Neither side sends the token.

func mac(token []byte, label string, a, b [32]byte) [32]byte {
	h := hmac.New(sha256.New, token)
	h.Write([]byte(label))
	h.Write(a[:])
	h.Write(b[:])
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

func writeFrame(w io.Writer, f *Frame) error {
	_, err := w.Write(AppendFrame(make([]byte, 0, 128), f))
	return err
}

func clientHandshake(c net.Conn, token []byte, deadline time.Time) error {
	_ = c.SetDeadline(deadline)
	defer c.SetDeadline(time.Time{})
	var cn [32]byte
	_, _ = rand.Read(cn[:])
	if err := writeFrame(c, &Frame{Type: FrameHello, Version: ProtocolVersion, Nonce: cn}); err != nil {
		return err
	}
	var buf []byte
	f, err := ReadFrame(c, &buf)
	if err != nil {
		return err
	}
	if f.Type == FrameError {
		return fmt.Errorf("server refused: %s: %w", f.Msg, ErrAuth)
	}
	if f.Type != FrameChallenge {
		return fmt.Errorf("want challenge, got frame type %d: %w", f.Type, ErrAuth)
	}
	want := mac(token, "atoll-server", cn, f.Nonce)
	if !hmac.Equal(want[:], f.MAC[:]) {
		// Either side may hold the wrong token: we cannot tell which.
		return fmt.Errorf("the server's proof does not match our cluster token (one side has a different token): %w", ErrAuth)
	}
	if err := writeFrame(c, &Frame{Type: FrameAuth, MAC: mac(token, "atoll-client", f.Nonce, cn)}); err != nil {
		return err
	}
	f, err = ReadFrame(c, &buf)
	if err != nil {
		return err
	}
	if f.Type != FrameAuthOK {
		return fmt.Errorf("server rejected our proof (%s): %w", f.Msg, ErrAuth)
	}
	return nil
}

// serverHandshake authenticates the client; on failure the caller counts it and
// then tells the client (so the count is visible when the client sees the error).
func serverHandshake(c net.Conn, token []byte, deadline time.Time) error {
	_ = c.SetDeadline(deadline)
	var buf []byte
	f, err := ReadFrame(c, &buf)
	if err != nil {
		return err
	}
	if f.Type != FrameHello || f.Version != ProtocolVersion {
		return fmt.Errorf("want hello v%d, got type %d v%d: %w", ProtocolVersion, f.Type, f.Version, ErrAuth)
	}
	var sn [32]byte
	_, _ = rand.Read(sn[:])
	if err := writeFrame(c, &Frame{Type: FrameChallenge, Nonce: sn, MAC: mac(token, "atoll-server", f.Nonce, sn)}); err != nil {
		return err
	}
	cn := f.Nonce
	f, err = ReadFrame(c, &buf)
	if err != nil {
		return err
	}
	want := mac(token, "atoll-client", sn, cn)
	if f.Type != FrameAuth || !hmac.Equal(want[:], f.MAC[:]) {
		return fmt.Errorf("the client's proof does not match our cluster token (one side has a different token): %w", ErrAuth)
	}
	if err := writeFrame(c, &Frame{Type: FrameAuthOK}); err != nil {
		return err
	}
	return c.SetDeadline(time.Time{})
}
