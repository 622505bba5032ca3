package extproc

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// DefaultIdleMemory is the resident memory the service returns to after a
// burst, beside twice the request bodies still in flight (MemoryTrim).
const DefaultIdleMemory = 64 << 20

// MemoryTrim gives memory back to the operating system after a burst.
//
// The service runs with GOGC 400 (cheaper decisions): its heap goal is five
// times the live heap at the last collection, and the runtime keeps about
// that much resident afterwards. A burst of large bodies (150 concurrent
// 220 KB bodies) leaves the goal, and the resident set, at hundreds of MB
// long after the burst ended: the next collection only comes with the next
// allocations, and the scavenger returns memory down to the goal, not to
// what is live. So once a second MemoryTrim compares the resident set with
// Idle plus twice the body bytes in flight and, when it is above that and
// the runtime holds more than trimSlack beyond its live heap, forces a
// collection and returns the free memory (debug.FreeOSMemory), at most once
// per MinGap. Under sustained load that costs one full collection per MinGap
// (a few ms with the live heap of a decision service); idle, nothing.
type MemoryTrim struct {
	// Idle is the resident bytes allowed with nothing in flight (0: never
	// trim).
	Idle int64
	// InFlight is the request-body bytes in flight (Server.BodyBytesInFlight).
	InFlight func() int64
	// Interval between checks (default 1 s) and MinGap, the least time
	// between two trims (default 5 s).
	Interval, MinGap time.Duration
	// OnTrim, if set, is called after each trim with the resident bytes
	// before and after.
	OnTrim func(before, after int64)
}

// trimSlack is how much more than its live heap the runtime must hold for
// a trim to be worth a collection.
const trimSlack = 16 << 20

// Run checks and trims until ctx ends.
func (t *MemoryTrim) Run(ctx context.Context) {
	if t.Idle <= 0 {
		return
	}
	interval, gap := t.Interval, t.MinGap
	if interval <= 0 {
		interval = time.Second
	}
	if gap <= 0 {
		gap = 5 * time.Second
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var last time.Time
	samples := []rtmetrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}, {Name: "/gc/heap/live:bytes"}}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if now.Sub(last) < gap {
				continue
			}
			var inFlight int64
			if t.InFlight != nil {
				inFlight = t.InFlight()
			}
			rss := residentBytes()
			if rss <= t.Idle+2*inFlight {
				continue
			}
			rtmetrics.Read(samples)
			held := int64(samples[0].Value.Uint64()) - int64(samples[1].Value.Uint64()) - int64(samples[2].Value.Uint64())
			if held < trimSlack {
				continue // what is resident is live (or not the heap's)
			}
			// Two collections: buffers parked in sync.Pools (ours, gRPC's)
			// survive the first one in the pools' victim caches.
			runtime.GC()
			debug.FreeOSMemory()
			last = time.Now()
			if t.OnTrim != nil {
				t.OnTrim(rss, residentBytes())
			}
		}
	}
}

// residentBytes is the process's resident set size from /proc/self/statm
// (the figure an out-of-memory killer judges), or, where there is none,
// what the Go runtime has mapped and not returned.
func residentBytes() int64 {
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			if pages, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				return pages * int64(os.Getpagesize())
			}
		}
	}
	s := []rtmetrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	rtmetrics.Read(s)
	return int64(s[0].Value.Uint64() - s[1].Value.Uint64())
}
