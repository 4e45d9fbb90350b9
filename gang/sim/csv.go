package sim

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// Sentinel errors of the simulator.
var (
	// ErrBadRow reports a trace row that cannot be parsed; the message names file and line.
	ErrBadRow = errors.New("sim: bad trace row")
	// ErrBadHeader reports a trace whose header is not a known format.
	ErrBadHeader = errors.New("sim: unknown trace header")
	// ErrBadSpec reports a cluster spec or option that cannot be used.
	ErrBadSpec = errors.New("sim: bad spec")
)

// table is a parsed CSV file: a header and rows, each row with its 1-based line number.
type table struct {
	file   string
	header []string
	rows   [][]string
	lines  []int
	col    map[string]int
}

// readTable reads a simple CSV (no quoted commas in these traces) tolerantly: a missing
// final newline, CRLF line ends, blank lines and surrounding spaces are accepted; a row
// with the wrong number of fields is an error naming file and line unless skipBad is set,
// in which case it is dropped and reported through skipped. A path ending in ".gz" is
// read through gzip (the repository keeps its largest trace compressed).
func readTable(path string, skipBad bool, skipped func(error)) (*table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("sim: open %s: %w", path, err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(strings.ToLower(path), ".gz") {
		z, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("sim: %s: %w", path, err)
		}
		defer z.Close()
		r = z
	}
	return parseTable(path, r, skipBad, skipped)
}

func parseTable(name string, r io.Reader, skipBad bool, skipped func(error)) (*table, error) {
	t := &table{file: name, col: map[string]int{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(text) == "" {
			continue
		}
		fields := strings.Split(text, ",")
		for i := range fields {
			fields[i] = strings.TrimSpace(fields[i])
		}
		if t.header == nil {
			if len(fields) > 0 {
				fields[0] = strings.TrimPrefix(fields[0], "#")
			}
			t.header = fields
			for i, h := range fields {
				t.col[strings.ToLower(h)] = i
			}
			continue
		}
		if len(fields) != len(t.header) {
			err := fmt.Errorf("sim: %s:%d: %d fields, header has %d: %w", name, line, len(fields), len(t.header), ErrBadRow)
			if !skipBad {
				return nil, err
			}
			if skipped != nil {
				skipped(err)
			}
			continue
		}
		if len(t.rows) >= MaxTraceJobs {
			return nil, fmt.Errorf("sim: %s:%d: more than %d rows: %w", name, line, MaxTraceJobs, ErrBadRow)
		}
		t.rows = append(t.rows, fields)
		t.lines = append(t.lines, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("sim: read %s: %w", name, err)
	}
	if t.header == nil {
		return nil, fmt.Errorf("sim: %s: empty file: %w", name, ErrBadHeader)
	}
	return t, nil
}

// rowErr builds the error for a bad value.
func (t *table) rowErr(i int, col, val, why string) error {
	return fmt.Errorf("sim: %s:%d: column %s value %q: %s: %w", t.file, t.lines[i], col, val, why, ErrBadRow)
}

// num parses column col of row i as a float; empty reads as def.
func (t *table) num(i int, col string, def float64) (float64, error) {
	c, ok := t.col[col]
	if !ok {
		return def, nil
	}
	v := t.rows[i][c]
	if v == "" || strings.EqualFold(v, "nan") {
		return def, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, t.rowErr(i, col, v, "not a number")
	}
	if err != nil || math.IsInf(f, 0) {
		return 0, t.rowErr(i, col, v, "not a finite number")
	}
	if f < 0 {
		return 0, t.rowErr(i, col, v, "negative")
	}
	return f, nil
}

// bounded checks that v, read from column col of row i, lies in [lo, hi] and, when whole
// is set, is a whole number.
func (t *table) bounded(i int, col string, v, lo, hi float64, whole bool) error {
	if whole && v != math.Trunc(v) {
		return t.rowErr(i, col, t.str(i, col), fmt.Sprintf("want a whole number in [%v, %v]", lo, hi))
	}
	if v < lo || v > hi {
		return t.rowErr(i, col, t.str(i, col), fmt.Sprintf("outside [%v, %v]", lo, hi))
	}
	return nil
}

func (t *table) str(i int, col string) string {
	c, ok := t.col[col]
	if !ok {
		return ""
	}
	return t.rows[i][c]
}

// Skipper collects rows dropped when bad rows are to be skipped.
type Skipper struct {
	Errors []error
}

// Add records a skipped row.
func (s *Skipper) Add(err error) { s.Errors = append(s.Errors, err) }
