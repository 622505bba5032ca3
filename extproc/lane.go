package extproc

import "sync"

// lane admits a bounded number of holders at a time, the bound read at
// each call (it may change between calls: the adaptive-procs controller
// moves GOMAXPROCS). Waiters are served first come, first served.
//
// The ext_proc server puts its decisions on large bodies in a lane bounded
// by GOMAXPROCS: a burst of them (64 hostile bodies at once) would
// otherwise put as many runnable goroutines, each parsing for a
// millisecond, ahead of every small request's decision and of the
// transport's frame readers in the scheduler's queues. Waiting in the lane
// they are not runnable.
type lane struct {
	mu sync.Mutex
	// busy is the holders; waiting the parked callers, oldest first.
	// Both guarded by mu.
	busy    int
	waiting []chan struct{}
}

// acquire takes a place when fewer than limit (at least 1) hold one, else
// waits for one; it reports whether it waited.
func (l *lane) acquire(limit int) (waited bool) {
	l.mu.Lock()
	if l.busy < max(limit, 1) && len(l.waiting) == 0 {
		l.busy++
		l.mu.Unlock()
		return false
	}
	ch := make(chan struct{})
	l.waiting = append(l.waiting, ch)
	l.mu.Unlock()
	<-ch // a release gave us its place (busy counts us already)
	return true
}

// release gives a place back: to the oldest waiters while fewer than
// limit hold one (more than one if the limit grew).
func (l *lane) release(limit int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.busy--
	for l.busy < max(limit, 1) && len(l.waiting) > 0 {
		close(l.waiting[0])
		l.waiting[0] = nil
		l.waiting = l.waiting[1:]
		l.busy++
	}
}
