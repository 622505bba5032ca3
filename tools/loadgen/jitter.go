package loadgen

import "time"

// StartJitterProbe runs a goroutine that sleeps 1 ms at a time and records
// how late it wakes; the returned function stops it and returns the
// lateness. Its tail is the environment's (the OS scheduler, other
// processes, the Go runtime), not the code under measurement: a latency tail
// no longer than the probe's is noise the measured code cannot remove, and
// a timing test on a loaded machine can widen its tolerance by the
// starvation the probe saw (Starvation) instead of flaking.
func StartJitterProbe() (stop func() *Histogram) {
	done := make(chan struct{})
	out := make(chan *Histogram)
	go func() {
		var h Histogram
		for {
			select {
			case <-done:
				out <- &h
				return
			default:
			}
			t := time.Now()
			time.Sleep(time.Millisecond)
			h.RecordDuration(time.Since(t) - time.Millisecond)
		}
	}()
	return func() *Histogram {
		close(done)
		return <-out
	}
}

// Starvation is the total lateness a jitter probe's histogram recorded: how
// long, summed over its wake-ups, the probe wanted the CPU and did not get
// it. On an idle machine it is timer slack (tens of µs per wake-up); on a
// starved one it approaches the probe's run time.
func Starvation(h *Histogram) time.Duration {
	return time.Duration(h.Mean() * float64(h.Count()))
}
