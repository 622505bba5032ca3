package drills

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http/httptrace"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferlb/inferlb/api/headers"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/internal/llmclient"
	"github.com/inferlb/inferlb/internal/tokens"
)

// outcome classifies what a client saw.
type outcome int

const (
	// outcomeOK: 200 and a complete stream ending in [DONE].
	outcomeOK outcome = iota
	// outcomeShed: 429 (load shedding, by design).
	outcomeShed
	// outcomeFailed: no response, or a status other than 200 and 429.
	outcomeFailed
	// outcomeCut: 200, then the stream broke before [DONE].
	outcomeCut
)

func (o outcome) String() string { return [...]string{"ok", "shed", "failed", "cut"}[o] }

type request struct {
	prompt    string
	maxTokens int
	priority  string
	session   string
}

type result struct {
	id         int
	outcome    outcome
	status     int
	err        error
	priority   string
	start, end time.Time
}

func (r result) String() string {
	if r.err != nil {
		return fmt.Sprintf("%s (status %d): %v", r.outcome, r.status, r.err)
	}
	return fmt.Sprintf("%s (status %d)", r.outcome, r.status)
}

// client streams chat completions through the stack, as loadgen does.
type client struct{ lc *llmclient.Client }

func newClient(url string) *client {
	return &client{lc: &llmclient.Client{BaseURL: url, Model: "m", Headers: llmclient.HeaderNames{Session: headers.SessionID, Priority: headers.Priority},
		IgnoreEOS: true, Timeout: 60 * time.Second}}
}

func (c *client) close() { c.lc.CloseIdleConnections() }

func (c *client) do(ctx context.Context, r request) result {
	wr := &llmclient.Request{Messages: []tokens.Message{{Role: "system", Content: "you are a drill"}, {Role: "user", Content: r.prompt}},
		MaxTokens: r.maxTokens, Priority: r.priority, SessionID: r.session}
	start := time.Now()
	res := c.lc.Do(ctx, wr, false)
	out := result{status: res.Status, err: res.Err, priority: r.priority, start: start, end: time.Now()}
	switch {
	case res.Outcome == llmclient.OK:
		out.outcome = outcomeOK
	case res.Outcome == llmclient.Rejected:
		out.outcome = outcomeShed
	case res.Status == 200:
		out.outcome = outcomeCut
	default:
		out.outcome = outcomeFailed
	}
	return out
}

// trafficOptions describe a load.
type trafficOptions struct {
	// rate is the open-loop (Poisson) arrival rate per second.
	rate float64
	// maxTokens per request.
	maxTokens int
	// mix is the share of each priority (sums to 1); default all "high".
	mix map[string]float64
	// words per user prompt (default 30).
	words int
}

// traffic is a running load; every request it sent is recorded.
type traffic struct {
	o      trafficOptions
	c      *client
	stopCh chan struct{}
	wg     sync.WaitGroup

	mu      sync.Mutex
	results []result
	sent    int
	live    map[int]bool // started, not finished
	// answered holds the requests in live whose response head arrived.
	answered map[int]bool
}

func (s *stack) startTraffic(o trafficOptions) *traffic {
	if o.maxTokens == 0 {
		o.maxTokens = 16
	}
	if o.mix == nil {
		o.mix = map[string]float64{"high": 1}
	}
	if o.words == 0 {
		o.words = 30
	}
	tr := &traffic{o: o, c: newClient(s.url), stopCh: make(chan struct{}), live: map[int]bool{}, answered: map[int]bool{}}
	tr.wg.Add(1)
	go tr.arrivals()
	s.t.Cleanup(func() { tr.stop() })
	return tr
}

func (tr *traffic) arrivals() {
	defer tr.wg.Done()
	rng := rand.New(rand.NewPCG(7, 11))
	prios := make([]string, 0, len(tr.o.mix))
	for p := range tr.o.mix {
		prios = append(prios, p)
	}
	sort.Strings(prios)
	next := time.Now()
	for i := 0; ; i++ {
		next = next.Add(time.Duration(rng.ExpFloat64() / tr.o.rate * float64(time.Second)))
		// Behind by more than a few arrivals (this process stalled): go on
		// from now rather than fire the missed arrivals at once. A
		// stall's catch-up burst is the test machine's, not traffic's: it
		// crossed the top priority's local in-flight limit and inflated
		// the demand window.
		if now := time.Now(); now.Sub(next) > 100*time.Millisecond {
			next = now
		}
		select {
		case <-tr.stopCh:
			return
		case <-time.After(time.Until(next)):
		}
		u, prio := rng.Float64(), prios[len(prios)-1]
		for _, p := range prios {
			if u < tr.o.mix[p] {
				prio = p
				break
			}
			u -= tr.o.mix[p]
		}
		words := make([]string, tr.o.words)
		for k := range words {
			words[k] = fmt.Sprintf("w%d", rng.IntN(1000))
		}
		r := request{prompt: fmt.Sprintf("conversation %d: %s", i, strings.Join(words, " ")), maxTokens: tr.o.maxTokens, priority: prio}
		tr.mu.Lock()
		tr.sent++
		tr.live[i] = true
		tr.mu.Unlock()
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotFirstResponseByte: func() {
				tr.mu.Lock()
				tr.answered[i] = true
				tr.mu.Unlock()
			}})
			res := tr.c.do(ctx, r)
			res.id = i
			tr.mu.Lock()
			tr.results = append(tr.results, res)
			delete(tr.live, i)
			delete(tr.answered, i)
			tr.mu.Unlock()
		}()
	}
}

// stop ends the arrivals and waits for every request in flight to finish.
func (tr *traffic) stop() tally {
	select {
	case <-tr.stopCh:
	default:
		close(tr.stopCh)
	}
	tr.wg.Wait()
	tr.c.close()
	return tr.tally(time.Time{}, time.Time{})
}

// tally counts the finished requests that started in [from, to) (zero
// times: unbounded).
func (tr *traffic) tally(from, to time.Time) tally {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	t := tally{byPriority: map[string]*counts{}}
	if from.IsZero() && to.IsZero() {
		t.sent = tr.sent
	}
	for _, r := range tr.results {
		if (!from.IsZero() && r.start.Before(from)) || (!to.IsZero() && !r.start.Before(to)) {
			continue
		}
		if !(from.IsZero() && to.IsZero()) {
			t.sent++
		}
		t.all.add(r)
		c := t.byPriority[r.priority]
		if c == nil {
			c = &counts{}
			t.byPriority[r.priority] = c
		}
		c.add(r)
		if r.outcome != outcomeOK && r.outcome != outcomeShed && len(t.examples) < 5 {
			t.examples = append(t.examples, r.String())
		}
	}
	return t
}

// inFlight returns the requests in flight now (started, not finished).
func (tr *traffic) inFlight() map[int]bool { return tr.snapshot(tr.live) }

// answeredInFlight returns the requests in flight now whose response head
// has arrived: the stack has routed them (the ext_proc decision came
// before the upstream request), however late each step ran.
func (tr *traffic) answeredInFlight() map[int]bool { return tr.snapshot(tr.answered) }

// snapshot copies one of tr's request sets under tr.mu.
func (tr *traffic) snapshot(set map[int]bool) map[int]bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return maps.Clone(set)
}

// tallyOf counts how the given requests ended (those finished so far).
func (tr *traffic) tallyOf(ids map[int]bool) tally {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	t := tally{byPriority: map[string]*counts{}}
	for _, r := range tr.results {
		if !ids[r.id] {
			continue
		}
		t.sent++
		t.all.add(r)
		if r.outcome != outcomeOK && len(t.examples) < 5 {
			t.examples = append(t.examples, r.String())
		}
	}
	return t
}

type counts struct{ ok, shed, failed, cut int }

func (c *counts) add(r result) {
	switch r.outcome {
	case outcomeOK:
		c.ok++
	case outcomeShed:
		c.shed++
	case outcomeFailed:
		c.failed++
	case outcomeCut:
		c.cut++
	}
}

type tally struct {
	sent       int
	all        counts
	byPriority map[string]*counts
	examples   []string
}

func (t tally) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sent %d: ok %d, failed %d, cut %d, shed %d", t.sent, t.all.ok, t.all.failed, t.all.cut, t.all.shed)
	var ps []string
	for p := range t.byPriority {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	for _, p := range ps {
		c := t.byPriority[p]
		fmt.Fprintf(&b, "; %s: ok %d, failed %d, cut %d, shed %d", p, c.ok, c.failed, c.cut, c.shed)
	}
	if len(t.examples) > 0 {
		fmt.Fprintf(&b, "; e.g. %s", strings.Join(t.examples, " | "))
	}
	return b.String()
}

// waitSent waits until the load has sent n requests in all.
func (tr *traffic) waitSent(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	if err := envoytest.Poll(context.Background(), timeout, 20*time.Millisecond, func() error {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if tr.sent < n {
			return fmt.Errorf("traffic sent %d of %d requests", tr.sent, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// sentCount is the number of requests sent so far.
func (tr *traffic) sentCount() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.sent
}
