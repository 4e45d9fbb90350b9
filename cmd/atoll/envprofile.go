package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"time"
)

// envProfile profiles the CPU of a process a bench starts itself (`atoll bench scale`'s heads
// and hollow processes, the cluster benches' workers): with ATOLL_CPUPROFILE_DIR set, from
// ATOLL_CPUPROFILE_AFTER (a duration, default 10s) after the start for ATOLL_CPUPROFILE_FOR
// (default 20s), into DIR/NAME.pprof; with ATOLL_TRACE=1 as well, an execution trace of the
// same span into DIR/NAME.trace (go tool trace: which goroutines waited to run, and for
// what). A bad setting is an error naming it.
func envProfile(name string) error {
	dir := os.Getenv("ATOLL_CPUPROFILE_DIR")
	if dir == "" {
		return nil
	}
	dur := func(key string, def time.Duration) (time.Duration, error) {
		v := os.Getenv(key)
		if v == "" {
			return def, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return 0, fmt.Errorf("%s=%q: want a duration such as 10s", key, v)
		}
		return d, nil
	}
	after, err := dur("ATOLL_CPUPROFILE_AFTER", 10*time.Second)
	if err != nil {
		return err
	}
	span, err := dur("ATOLL_CPUPROFILE_FOR", 20*time.Second)
	if err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, name+".pprof"))
	if err != nil {
		return fmt.Errorf("ATOLL_CPUPROFILE_DIR: %w", err)
	}
	var tf *os.File
	if os.Getenv("ATOLL_TRACE") == "1" {
		if tf, err = os.Create(filepath.Join(dir, name+".trace")); err != nil {
			return fmt.Errorf("ATOLL_CPUPROFILE_DIR: %w", err)
		}
	}
	time.AfterFunc(after, func() {
		if tf != nil && trace.Start(tf) == nil {
			time.AfterFunc(span, func() { trace.Stop(); tf.Close() })
		}
		if pprof.StartCPUProfile(f) != nil {
			f.Close()
			return
		}
		time.AfterFunc(span, func() { pprof.StopCPUProfile(); f.Close() })
	})
	return nil
}
