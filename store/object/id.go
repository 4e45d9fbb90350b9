package object

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// ID names an object: 32 bytes, either random (NewID) or the SHA-256 of the content
// (ContentID). Its printable form is 64 lowercase hex digits.
type ID [32]byte

// NewID returns a random id.
func NewID() ID {
	var id ID
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails on Linux.
	return id
}

// ContentID returns the SHA-256 of b as an id, so equal bytes get equal ids.
func ContentID(b []byte) ID { return ID(sha256.Sum256(b)) }

// String returns the 64-hex-digit printable form.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// Short returns the first 12 hex digits, for logs.
func (id ID) Short() string { return hex.EncodeToString(id[:6]) }

// IsZero reports whether id is the zero id.
func (id ID) IsZero() bool { return id == ID{} }

// ParseID parses the printable form written by String.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 64 {
		return id, fmt.Errorf("object: parse id %q: want 64 hex digits, got %d: %w", s, len(s), ErrBadID)
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("object: parse id %q: %v: %w", s, err, ErrBadID)
	}
	return id, nil
}
