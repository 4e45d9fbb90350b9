package head

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestSchedLatencySeesRunWaits: with more busy goroutines than the process's cores, a
// wakeup waits to run, and since() reports it; a second call reports only what came after
// the first.
func TestSchedLatencySeesRunWaits(t *testing.T) {
	var s schedLatency
	s.since()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for i := 0; i < 1e6; i++ {
					_ = i * i
				}
			}
		}()
	}
	for range 20 {
		time.Sleep(time.Millisecond) // each wakeup queues behind the busy goroutines
	}
	close(stop)
	wg.Wait()
	worst, _ := s.since()
	if worst <= 0 {
		t.Fatalf("worst run wait %v with 4 busy goroutines on one core: want > 0", worst)
	}
	if again, _ := s.since(); again > worst {
		t.Fatalf("a second call saw %v, more than the first's %v with nothing busy", again, worst)
	}
}
