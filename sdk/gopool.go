package sdk

import "time"

// Goroutines for the calls and tasks in flight. Each asynchronous call or task waits in a
// goroutine of its own, and that goroutine's stack grows as the call goes down through
// the actor system (about a fifth of a pending task's CPU went to copying stacks as they
// grew, measured with atoll bench ray's single_client_tasks_async). spawn hands the work
// to a goroutine that finished earlier work and whose stack has grown already, and starts
// a new one only when none is idle; an idle goroutine exits after idleExit.

// idleGoroutines hands work to goroutines waiting for more (unbuffered: a send succeeds
// only when one is waiting).
var idleGoroutines = make(chan func())

const idleExit = 5 * time.Second

// spawn runs fn in a goroutine, a reused one when one is idle.
func spawn(fn func()) {
	select {
	case idleGoroutines <- fn:
	default:
		go reuse(fn)
	}
}

func reuse(fn func()) {
	t := time.NewTimer(idleExit)
	defer t.Stop()
	for {
		fn()
		fn = nil
		t.Reset(idleExit)
		select {
		case fn = <-idleGoroutines:
		case <-t.C:
			return
		}
	}
}
