package head

import (
	"fmt"
	"strings"
	"testing"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// A new leader decodes its tables on several goroutines: every record lands in its place,
// and a record that does not decode is named by its key.
func TestDecodeAllKeepsOrderAndNamesTheBadRecord(t *testing.T) {
	for _, n := range []int{0, 1, 511, 512, 513, 5000} {
		kvs := make([]meta.KeyValue, n)
		for i := range kvs {
			kvs[i] = meta.KeyValue{Key: fmt.Sprintf("workers/j/g/%d", i), Value: []byte(fmt.Sprintf(`{"job":"j","gang":"g","rank":%d}`, i))}
		}
		ws, err := decodeAll[api.Worker](kvs, "worker")
		if err != nil || len(ws) != n {
			t.Fatalf("%d records: %d decoded, %v", n, len(ws), err)
		}
		for i, w := range ws {
			if w.Rank != i || w.Job != "j" {
				t.Fatalf("%d records: record %d decoded as %+v", n, i, w)
			}
		}
		if n == 0 {
			continue
		}
		bad := n * 2 / 3
		kvs[bad].Value = []byte(`{"rank":`)
		if _, err := decodeAll[api.Worker](kvs, "worker"); err == nil || !strings.Contains(err.Error(), "worker "+kvs[bad].Key+":") {
			t.Fatalf("%d records, record %d broken: %v, want an error naming %s", n, bad, err, kvs[bad].Key)
		}
	}
}
