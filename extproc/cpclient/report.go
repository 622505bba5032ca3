package cpclient

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

// Reporter sends one ReportRequest per interval, to every control-plane
// replica: each computes the weights from the demand it hears, so each must
// hear all of it. A report that could not be sent to a replica is merged
// into the next one for that replica (counts add up), for at most
// MaxBacklog; older evidence is dropped as stale.
type Reporter struct {
	// Conn is the control plane; Conns, if set, are its replicas (Conn is
	// then ignored).
	Conn             grpc.ClientConnInterface
	Conns            []grpc.ClientConnInterface
	NodeID, Instance string
	// Interval between reports (default 1 s).
	Interval time.Duration
	// MaxBacklog bounds how long unsent observations are kept (default 30 s).
	MaxBacklog time.Duration
	// Flush returns the interval's observations and starts a new interval
	// (extproc.Observer.Flush).
	Flush func(now time.Time) *policyv1.ReportRequest
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Sent, if set, is called after each successful report to a replica
	// (concurrently, one call per replica reached).
	Sent func(*policyv1.ReportRequest)
}

// target is one replica and its unsent backlog.
type target struct {
	client  policyv1.ReportsClient
	pending *policyv1.ReportRequest
}

// Run reports until ctx is cancelled, then sends a last report.
func (r *Reporter) Run(ctx context.Context) error {
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	if r.Interval <= 0 {
		r.Interval = time.Second
	}
	if r.MaxBacklog <= 0 {
		r.MaxBacklog = 30 * time.Second
	}
	conns := r.Conns
	if len(conns) == 0 {
		conns = []grpc.ClientConnInterface{r.Conn}
	}
	targets := make([]*target, len(conns))
	for i, c := range conns {
		targets[i] = &target{client: policyv1.NewReportsClient(c)}
	}
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), time.Second)
			r.once(fctx, targets, time.Now())
			cancel()
			return nil
		case <-t.C:
			// The clock, not the tick's time: after a stall (the process
			// stopped, starved) the ticker holds a tick from long ago, and
			// an interval ending then is refused as a clock error.
			now := time.Now()
			cctx, cancel := context.WithTimeout(ctx, r.Interval)
			r.once(cctx, targets, now)
			cancel()
		}
	}
}

// once flushes one interval and sends it to every replica at once (a
// replica that does not answer does not delay the others).
func (r *Reporter) once(ctx context.Context, targets []*target, now time.Time) {
	rep := r.Flush(now)
	rep.NodeId, rep.Instance = r.NodeID, r.Instance
	var wg sync.WaitGroup
	for i, tg := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.send(ctx, i, tg, rep, now)
		}()
	}
	wg.Wait()
}

func (r *Reporter) send(ctx context.Context, i int, tg *target, rep *policyv1.ReportRequest, now time.Time) {
	if tg.pending != nil {
		if now.Sub(tg.pending.GetIntervalStart().AsTime()) > r.MaxBacklog {
			r.Logger.Warn("dropping unsent report backlog", "replica", i, "since", tg.pending.GetIntervalStart().AsTime())
		} else {
			rep = Merge(tg.pending, rep)
		}
		tg.pending = nil
	}
	if len(rep.Demand) == 0 && len(rep.Engines) == 0 && len(rep.Prefixes) == 0 {
		return // nothing seen: a heartbeat would carry no information
	}
	if _, err := tg.client.Report(ctx, rep); err != nil {
		if status.Code(err) == codes.InvalidArgument || status.Code(err) == codes.Unauthenticated {
			// Refused, not lost: sending it again would be refused again.
			r.Logger.Error("report refused by the control plane", "replica", i, "err", err)
			return
		}
		r.Logger.Warn("report failed; will merge into the next", "replica", i, "err", err)
		tg.pending = rep
		return
	}
	if r.Sent != nil {
		r.Sent(rep)
	}
}

// Merge adds b's counts to a's (a's interval start, b's end) and returns it.
func Merge(a, b *policyv1.ReportRequest) *policyv1.ReportRequest {
	out := &policyv1.ReportRequest{NodeId: b.NodeId, Instance: b.Instance, IntervalStart: a.IntervalStart, IntervalEnd: b.IntervalEnd}
	type dk struct{ c, p string }
	dm := map[dk]*policyv1.DemandSample{}
	for _, d := range append(append([]*policyv1.DemandSample(nil), a.Demand...), b.Demand...) {
		k := dk{d.Class, d.Priority}
		if x := dm[k]; x != nil {
			x.Requests += d.Requests
			x.Shed += d.Shed
			x.PromptTokens += d.PromptTokens
			x.OutputTokens += d.OutputTokens
			continue
		}
		c := &policyv1.DemandSample{Class: d.Class, Priority: d.Priority, Requests: d.Requests, Shed: d.Shed, PromptTokens: d.PromptTokens, OutputTokens: d.OutputTokens}
		dm[k] = c
		out.Demand = append(out.Demand, c)
	}
	em := map[string]*policyv1.EngineEvidence{}
	for _, e := range append(append([]*policyv1.EngineEvidence(nil), a.Engines...), b.Engines...) {
		if x := em[e.Address]; x != nil {
			x.Responses += e.Responses
			x.Errors += e.Errors
			x.HeaderLatencySumSeconds += e.HeaderLatencySumSeconds
			x.HeaderLatencyCount += e.HeaderLatencyCount
			x.Completed += e.Completed
			x.CompletionSecondsSum += e.CompletionSecondsSum
			x.CompletionPromptTokens += e.CompletionPromptTokens
			x.CompletionOutputTokens += e.CompletionOutputTokens
			continue
		}
		c := proto.Clone(e).(*policyv1.EngineEvidence)
		em[e.Address] = c
		out.Engines = append(out.Engines, c)
	}
	out.Prefixes = mergePrefixes(a.Prefixes, b.Prefixes)
	return out
}

// maxMergedCounts bounds a class's prefix counts in a merged report: a
// long backlog keeps the heaviest.
const maxMergedCounts = 1024

// mergePrefixes adds two intervals' prefix reports, class by class and
// point by point (counts, error bounds and tokens add; conversation bitmaps
// are or-ed).
func mergePrefixes(a, b []*policyv1.PrefixReport) []*policyv1.PrefixReport {
	var out []*policyv1.PrefixReport
	byClass := map[string]*policyv1.PrefixReport{}
	byPoint := map[string]map[uint64]*policyv1.PrefixCount{}
	for _, r := range append(append([]*policyv1.PrefixReport(nil), a...), b...) {
		x := byClass[r.Class]
		if x == nil {
			x = &policyv1.PrefixReport{Class: r.Class}
			byClass[r.Class], byPoint[r.Class] = x, map[uint64]*policyv1.PrefixCount{}
			out = append(out, x)
		}
		x.Requests += r.Requests
		x.Tokens += r.Tokens
		for _, c := range r.Counts {
			if y := byPoint[r.Class][c.Prefix]; y != nil {
				y.Requests += c.Requests
				y.RequestsError += c.RequestsError
				y.Tokens += c.Tokens
				y.Continuations |= c.Continuations
				y.Conversations |= c.Conversations
				continue
			}
			y := &policyv1.PrefixCount{Prefix: c.Prefix, Parent: c.Parent, DepthBytes: c.DepthBytes, DepthTokens: c.DepthTokens,
				Flags: c.Flags, Requests: c.Requests, RequestsError: c.RequestsError, Tokens: c.Tokens, Continuations: c.Continuations,
				Conversations: c.Conversations}
			byPoint[r.Class][c.Prefix] = y
			x.Counts = append(x.Counts, y)
		}
	}
	for _, x := range out {
		if len(x.Counts) > maxMergedCounts {
			slices.SortStableFunc(x.Counts, func(p, q *policyv1.PrefixCount) int { return cmp.Compare(q.Requests, p.Requests) })
			x.Counts = x.Counts[:maxMergedCounts]
		}
	}
	return out
}
