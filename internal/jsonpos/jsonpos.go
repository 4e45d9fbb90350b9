// Package jsonpos turns byte offsets of JSON decoding errors into the positions users see.
package jsonpos

import "bytes"

// LineCol converts a byte offset in data (clamped to it) into a 1-based line and column.
func LineCol(data []byte, offset int64) (line, col int) {
	offset = max(0, min(offset, int64(len(data))))
	before := data[:offset]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(offset) - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return line, col
}
