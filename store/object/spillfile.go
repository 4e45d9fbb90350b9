// The cold tier's file format.

package object

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"
)

// Spill file layout: the header below, then one zstd stream of the object's bytes.
//
//	magic "ATOLSPL1" | id [32] | size u64 | fingerprint u64 | owner len u16 | owner
const spillMagic = "ATOLSPL1"

const (
	spillSuffix = ".spill"
	tmpSuffix   = ".tmp"
)

func spillName(id ID) string { return id.String() + spillSuffix }

type spillHeader struct {
	id    ID
	size  int64
	fp    uint64
	owner string
}

func (h spillHeader) marshal() []byte {
	b := make([]byte, 0, 8+32+8+8+2+len(h.owner))
	b = append(b, spillMagic...)
	b = append(b, h.id[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(h.size))
	b = binary.BigEndian.AppendUint64(b, h.fp)
	b = binary.BigEndian.AppendUint16(b, uint16(len(h.owner)))
	return append(b, h.owner...)
}

func readSpillHeader(r io.Reader) (spillHeader, error) {
	var h spillHeader
	var fixed [8 + 32 + 8 + 8 + 2]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return h, fmt.Errorf("header: %w", err)
	}
	if string(fixed[:8]) != spillMagic {
		return h, fmt.Errorf("header: bad magic %q", fixed[:8])
	}
	copy(h.id[:], fixed[8:40])
	size := binary.BigEndian.Uint64(fixed[40:48])
	if size > 1<<50 {
		return h, fmt.Errorf("header: implausible size %d", size)
	}
	h.size = int64(size)
	h.fp = binary.BigEndian.Uint64(fixed[48:56])
	owner := make([]byte, binary.BigEndian.Uint16(fixed[56:58]))
	if _, err := io.ReadFull(r, owner); err != nil {
		return h, fmt.Errorf("header owner: %w", err)
	}
	h.owner = string(owner)
	return h, nil
}

// isSpillTempName reports whether n is the temporary name of a spill in progress.
func isSpillTempName(n string) bool {
	base, ok := strings.CutSuffix(n, tmpSuffix)
	if !ok {
		return false
	}
	_, ok = isSpillName(base)
	return ok
}

func isSpillName(n string) (ID, bool) {
	s, ok := strings.CutSuffix(n, spillSuffix)
	if !ok {
		return ID{}, false
	}
	id, err := ParseID(s)
	return id, err == nil && id.String() == s // exactly the name spillName gives
}
