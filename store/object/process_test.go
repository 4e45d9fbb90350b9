package object

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestMain doubles as a worker process: with ATOLL_OBJECT_WORKER set to a JSON
// Mapping it maps the object read-only and prints the xxhash64 of what it sees.
func TestMain(m *testing.M) {
	if js := os.Getenv("ATOLL_OBJECT_WORKER"); js != "" {
		var mp Mapping
		if err := json.Unmarshal([]byte(js), &mp); err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		b, unmapFn, err := MapFile(mp)
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		fmt.Printf("%x\n", xxhash.Sum64(b))
		_ = unmapFn()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestWorkerProcessMapsObject(t *testing.T) {
	s := newTestStore(t, nil)
	ctx := context.Background()
	for _, size := range []int{3<<20 + 5, 700} {
		data := randBytes(size, uint64(size))
		id, err := s.Put(ctx, "driver", data)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.Map(ctx, id, "worker-9")
		if err != nil {
			t.Fatal(err)
		}
		js, _ := json.Marshal(m)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "ATOLL_OBJECT_WORKER="+string(js))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("worker process: %v", err)
		}
		if got, want := strings.TrimSpace(string(out)), fmt.Sprintf("%x", xxhash.Sum64(data)); got != want {
			t.Fatalf("size %d: worker process saw hash %s, want %s", size, got, want)
		}
		if err := s.Unmap(id, "worker-9"); err != nil {
			t.Fatal(err)
		}
	}
}
