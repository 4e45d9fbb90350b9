package jsonpos

import "testing"

func TestLineCol(t *testing.T) {
	data := []byte("{\n  \"a\": 1,\n  \"b\" 2\n}")
	for _, tt := range []struct {
		off             int64
		wantLine, wantC int
	}{{0, 1, 1}, {2, 2, 1}, {4, 2, 3}, {18, 3, 7}, {-5, 1, 1}, {1000, 4, 2}} {
		if l, c := LineCol(data, tt.off); l != tt.wantLine || c != tt.wantC {
			t.Errorf("offset %d: %d:%d, want %d:%d", tt.off, l, c, tt.wantLine, tt.wantC)
		}
	}
}
