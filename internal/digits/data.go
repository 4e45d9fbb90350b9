package digits

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/csv"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
)

//go:embed data/digits.csv.gz
var digitsCSV []byte

// Features and Classes of the digits data set.
const (
	Features = 64
	Classes  = 10
)

// Dataset is a set of examples: X is row-major len(Y) x Features, scaled to [0, 1].
type Dataset struct {
	X []float32
	Y []uint8
}

// Len is the number of examples.
func (d Dataset) Len() int { return len(d.Y) }

// Row is example i's features.
func (d Dataset) Row(i int) []float32 { return d.X[i*Features : (i+1)*Features] }

// Load reads the embedded UCI digits data set (see data/README.md for source and license)
// and splits it, shuffled with seed, into train and test sets (testShare of the examples).
func Load(seed uint64, testShare float64) (train, test Dataset, err error) {
	all, err := parse(bytes.NewReader(digitsCSV))
	if err != nil {
		return Dataset{}, Dataset{}, err
	}
	n := all.Len()
	perm := rand.New(rand.NewPCG(seed, 0x5eed)).Perm(n)
	nTest := int(float64(n) * testShare)
	pick := func(idx []int) Dataset {
		d := Dataset{X: make([]float32, 0, len(idx)*Features), Y: make([]uint8, 0, len(idx))}
		for _, i := range idx {
			d.X = append(d.X, all.Row(i)...)
			d.Y = append(d.Y, all.Y[i])
		}
		return d
	}
	return pick(perm[nTest:]), pick(perm[:nTest]), nil
}

func parse(r io.Reader) (Dataset, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return Dataset{}, fmt.Errorf("digits: %w", err)
	}
	cr := csv.NewReader(zr)
	cr.FieldsPerRecord = Features + 1
	var d Dataset
	for line := 1; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Dataset{}, fmt.Errorf("digits: %w", err)
		}
		for j := 0; j < Features; j++ {
			v, err := strconv.Atoi(rec[j])
			if err != nil || v < 0 || v > 16 {
				return Dataset{}, fmt.Errorf("digits: line %d column %d: %q is not a pixel value 0..16", line, j+1, rec[j])
			}
			d.X = append(d.X, float32(v)/16)
		}
		y, err := strconv.Atoi(rec[Features])
		if err != nil || y < 0 || y >= Classes {
			return Dataset{}, fmt.Errorf("digits: line %d: class %q is not 0..9", line, rec[Features])
		}
		d.Y = append(d.Y, uint8(y))
	}
	return d, nil
}
