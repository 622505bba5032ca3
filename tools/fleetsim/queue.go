package fleetsim

import "time"

// kind is what an event does.
type kind uint8

const (
	evArrive     kind = iota // a request reaches its frontend
	evNewSession             // the next open-loop session starts
	evDeliver                // a request reaches its engine
	evWake                   // an engine's next internal event
	evReturn                 // a response (or failure) reaches the frontend
	evRetry                  // Envoy retries after its back-off
	evScrape                 // the control plane scrapes every engine
	evReport                 // every ext_proc sends its report
	evCycle                  // a control cycle
	evHealth                 // Envoy's active health checks
	evSample                 // a time-series sample
	evFault                  // a fault starts (a ≥ 0) or ends (a < 0: −a−1)
	evTrace                  // the next trace row arrives
)

// event is one entry of the queue. Ties in time go in push order (seq), so
// a run is deterministic.
type event struct {
	t    time.Duration
	seq  uint64
	kind kind
	a    int32
	gen  uint32
	p    *request
}

// queue is a 4-ary min-heap of events by (t, seq), hand-written: the
// container/heap interface costs an allocation and two indirect calls per
// operation, and the simulator does several million; four children per
// node halve the depth.
type queue struct {
	h   []event
	seq uint64
}

func (q *queue) less(i, j int) bool {
	a, b := &q.h[i], &q.h[j]
	return a.t < b.t || (a.t == b.t && a.seq < b.seq)
}

func (q *queue) push(e event) {
	q.seq++
	e.seq = q.seq
	q.h = append(q.h, e)
	i := len(q.h) - 1
	for i > 0 {
		p := (i - 1) / 4
		if !q.less(i, p) {
			break
		}
		q.h[i], q.h[p] = q.h[p], q.h[i]
		i = p
	}
}

func (q *queue) pop() event {
	top := q.h[0]
	n := len(q.h) - 1
	q.h[0] = q.h[n]
	q.h[n] = event{}
	q.h = q.h[:n]
	i := 0
	for {
		m := i
		for c := 4*i + 1; c <= 4*i+4 && c < n; c++ {
			if q.less(c, m) {
				m = c
			}
		}
		if m == i {
			break
		}
		q.h[i], q.h[m] = q.h[m], q.h[i]
		i = m
	}
	return top
}

func (q *queue) len() int { return len(q.h) }
