package cpclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/cpclient"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/xdstest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func poll(t *testing.T, d time.Duration, what string, f func() bool) {
	t.Helper()
	if err := envoytest.Poll(context.Background(), d, 10*time.Millisecond, func() error {
		if !f() {
			return fmt.Errorf("timed out waiting for %s", what)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

type applied struct {
	mu       sync.Mutex
	versions []string
	reject   string // version to reject
}

func (a *applied) apply(p *policyv1.RoutingPolicy) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p.GetVersion() == a.reject {
		return errors.New("rejected for the test")
	}
	a.versions = append(a.versions, p.GetVersion())
	return nil
}

func (a *applied) last() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.versions) == 0 {
		return ""
	}
	return a.versions[len(a.versions)-1]
}

// The subscription applies policies, NACKs a rejected one (keeping the
// last good), keeps the last policy while the control plane is gone, and
// reconnects to a restarted control plane.
func TestSubscription(t *testing.T) {
	defer leaktest.AfterTest(t)()
	cp := xdstest.StartControlPlane(t, "")
	addr := cp.Addr
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	a := &applied{reject: "2"}
	sub := &cpclient.Subscriber{Conn: conn, NodeID: "n1", Apply: a.apply, Logger: quiet,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sub.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// Another node's policy is not ours.
	if err := cp.SetPolicy(&policyv1.RoutingPolicy{NodeId: "other", Version: "x"}); err != nil {
		t.Fatal(err)
	}
	if err := cp.SetPolicy(&policyv1.RoutingPolicy{NodeId: "n1", Version: "1"}); err != nil {
		t.Fatal(err)
	}
	poll(t, 5*time.Second, "version 1", func() bool { return a.last() == "1" && sub.Version() != "" })
	ack1 := sub.Version()
	// Rejected: NACK, the ACKed version stays.
	if err := cp.SetPolicy(&policyv1.RoutingPolicy{NodeId: "n1", Version: "2"}); err != nil {
		t.Fatal(err)
	}
	if err := cp.SetPolicy(&policyv1.RoutingPolicy{NodeId: "n1", Version: "3"}); err != nil {
		t.Fatal(err)
	}
	poll(t, 5*time.Second, "version 3 after the NACK of 2", func() bool { return a.last() == "3" })
	if sub.Version() == ack1 {
		t.Fatalf("ACKed version did not move past %q", ack1)
	}
	for _, v := range a.versions {
		if v == "2" || v == "x" {
			t.Fatalf("applied %q", v)
		}
	}

	// Control plane gone: nothing is applied, the last policy stays.
	cp.Stop()
	poll(t, 5*time.Second, "disconnect", func() bool { return !sub.Connected() })
	if a.last() != "3" {
		t.Fatalf("policy changed while disconnected: %v", a.versions)
	}
	// A restarted control plane (same address) with a new policy.
	cp2 := xdstest.StartControlPlane(t, addr)
	if err := cp2.SetPolicy(&policyv1.RoutingPolicy{NodeId: "n1", Version: "4"}); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, "version 4 after reconnect", func() bool { return a.last() == "4" })
	cp2.Stop()
}

// Reports arrive about every interval; a report that could not be sent is
// merged into the next one, so no count is lost over a short outage.
func TestReporter(t *testing.T) {
	defer leaktest.AfterTest(t)()
	cp := xdstest.StartControlPlane(t, "")
	addr := cp.Addr
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var mu sync.Mutex
	n := 0
	flush := func(now time.Time) *policyv1.ReportRequest {
		mu.Lock()
		defer mu.Unlock()
		n++
		return &policyv1.ReportRequest{IntervalStart: timestamppb.New(now.Add(-time.Second)), IntervalEnd: timestamppb.New(now),
			Demand:  []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: 2, Shed: 1, PromptTokens: 10, OutputTokens: 5}},
			Engines: []*policyv1.EngineEvidence{{Address: "a:1", Responses: 2, Errors: 1, HeaderLatencySumSeconds: 0.5, HeaderLatencyCount: 2}}}
	}
	r := &cpclient.Reporter{Conn: conn, NodeID: "n1", Instance: "i1", Interval: 20 * time.Millisecond, Flush: flush, Logger: quiet}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	poll(t, 5*time.Second, "reports", func() bool { return len(cp.Reports()) >= 3 })
	cp.Stop()
	mu.Lock()
	before := n
	mu.Unlock()
	poll(t, 5*time.Second, "flushes during the outage", func() bool { mu.Lock(); defer mu.Unlock(); return n >= before+3 })
	cp2 := xdstest.StartControlPlane(t, addr)
	poll(t, 10*time.Second, "reports after restart", func() bool { return len(cp2.Reports()) >= 1 })
	cancel()
	<-done
	cp2.Stop()
	mu.Lock()
	flushed := n
	mu.Unlock()
	var total uint64
	for _, rep := range append(cp.Reports(), cp2.Reports()...) {
		if rep.NodeId != "n1" || rep.Instance != "i1" {
			t.Fatalf("report from %q/%q", rep.NodeId, rep.Instance)
		}
		for _, d := range rep.Demand {
			total += d.Requests
		}
	}
	// Every flushed interval's 2 requests arrived (the last flush, at
	// shutdown, may have found the server stopped).
	if total < uint64(2*(flushed-1)) {
		t.Fatalf("requests reported %d, flushed %d intervals of 2", total, flushed)
	}
}

// With replicas, every report goes to each of them: one that is down does
// not delay the other, and gets what it missed (merged) when it is back.
func TestReporterReplicas(t *testing.T) {
	defer leaktest.AfterTest(t)()
	a, b := xdstest.StartControlPlane(t, ""), xdstest.StartControlPlane(t, "")
	var conns []grpc.ClientConnInterface
	for _, cp := range []*xdstest.ControlPlane{a, b} {
		c, err := grpc.NewClient(cp.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	var mu sync.Mutex
	n := 0
	flush := func(now time.Time) *policyv1.ReportRequest {
		mu.Lock()
		defer mu.Unlock()
		n++
		return &policyv1.ReportRequest{IntervalStart: timestamppb.New(now.Add(-time.Second)), IntervalEnd: timestamppb.New(now),
			Demand: []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: 1}}}
	}
	r := &cpclient.Reporter{Conns: conns, NodeID: "n1", Instance: "i1", Interval: 20 * time.Millisecond, Flush: flush, Logger: quiet}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	poll(t, 5*time.Second, "reports at both", func() bool { return len(a.Reports()) >= 2 && len(b.Reports()) >= 2 })
	bAddr := b.Addr
	b.Stop()
	got := len(a.Reports())
	poll(t, 5*time.Second, "reports at a while b is down", func() bool { return len(a.Reports()) >= got+5 })
	b2 := xdstest.StartControlPlane(t, bAddr)
	poll(t, 10*time.Second, "reports at b after its restart", func() bool { return len(b2.Reports()) >= 1 })
	cancel()
	<-done
	b2.Stop()
	a.Stop()
	sum := func(reps []*policyv1.ReportRequest) (s uint64) {
		for _, rep := range reps {
			for _, d := range rep.Demand {
				s += d.Requests
			}
		}
		return s
	}
	mu.Lock()
	flushed := uint64(n)
	mu.Unlock()
	// Each replica heard every interval (but perhaps the last, at shutdown).
	if ta, tb := sum(a.Reports()), sum(b.Reports())+sum(b2.Reports()); ta+1 < flushed || tb+1 < flushed {
		t.Fatalf("flushed %d intervals; replica a heard %d, b %d", flushed, ta, tb)
	}
}

func TestMerge(t *testing.T) {
	a := &policyv1.ReportRequest{IntervalStart: timestamppb.New(time.Unix(1, 0)),
		Demand:  []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: 1, Shed: 1}},
		Engines: []*policyv1.EngineEvidence{{Address: "x", Responses: 1, Errors: 1, HeaderLatencySumSeconds: 1, HeaderLatencyCount: 1}}}
	b := &policyv1.ReportRequest{IntervalEnd: timestamppb.New(time.Unix(3, 0)), NodeId: "n",
		Demand:  []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: 2}, {Class: "d", Priority: "p", Requests: 5}},
		Engines: []*policyv1.EngineEvidence{{Address: "x", Responses: 3, HeaderLatencySumSeconds: 2, HeaderLatencyCount: 3}}}
	m := cpclient.Merge(a, b)
	if m.IntervalStart.AsTime().Unix() != 1 || m.IntervalEnd.AsTime().Unix() != 3 || m.NodeId != "n" {
		t.Fatalf("interval/node %v", m)
	}
	if len(m.Demand) != 2 || m.Demand[0].Requests != 3 || m.Demand[0].Shed != 1 || m.Demand[1].Requests != 5 {
		t.Fatalf("demand %v", m.Demand)
	}
	if len(m.Engines) != 1 || m.Engines[0].Responses != 4 || m.Engines[0].Errors != 1 || m.Engines[0].HeaderLatencyCount != 4 {
		t.Fatalf("engines %v", m.Engines)
	}
	if a.Demand[0].Requests != 1 {
		t.Fatalf("Merge modified its input")
	}
}
