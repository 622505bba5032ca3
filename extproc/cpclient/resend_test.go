package cpclient_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/extproc/cpclient"
)

// slowReports is the control plane's intake behind a Reports service that
// takes every third report and then answers too late (the client's
// deadline passes: on a loaded machine the answer to a report that
// arrived can be late).
type slowReports struct {
	policyv1.UnimplementedReportsServer
	in *signals.Intake
	n  atomic.Int64
}

func (s *slowReports) Report(ctx context.Context, r *policyv1.ReportRequest) (*policyv1.ReportResponse, error) {
	if err := s.in.Report(ctx, r); err != nil {
		return nil, err
	}
	if s.n.Add(1)%3 == 1 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &policyv1.ReportResponse{}, nil
}

// A report whose answer is lost is resent merged into the next, yet it
// had arrived: the control plane counts every request once
// (TestEvidenceReports' evidence above the engine's attempts under load).
func TestReporterLostAnswersCountOnce(t *testing.T) {
	defer leaktest.AfterTest(t)()
	start := time.Now()
	in, err := signals.NewIntake(signals.IntakeOptions{Window: time.Hour, MaxInterval: time.Hour, Nodes: []string{"n1"}, Classes: []string{"c"}, Priorities: []string{"p"}})
	if err != nil {
		t.Fatal(err)
	}
	svc := &slowReports{in: in}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	policyv1.RegisterReportsServer(srv, svc)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); wg.Wait() }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var mu sync.Mutex
	var flushed uint64
	last := start
	flush := func(now time.Time) *policyv1.ReportRequest {
		mu.Lock()
		defer mu.Unlock()
		flushed += 3
		r := &policyv1.ReportRequest{IntervalStart: timestamppb.New(last), IntervalEnd: timestamppb.New(now),
			Demand:  []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: 3}},
			Engines: []*policyv1.EngineEvidence{{Address: "a:1", Responses: 3, Errors: 1}}}
		last = now
		return r
	}
	r := &cpclient.Reporter{Conn: conn, NodeID: "n1", Instance: "i1", Interval: 20 * time.Millisecond, Flush: flush, Logger: quiet}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	poll(t, 10*time.Second, "lost answers", func() bool { return svc.n.Load() >= 12 })
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	_, ev := in.Snapshot(time.Now())
	// Every interval was taken (the server takes every report), the last
	// one's answer perhaps lost at shutdown: the intake holds each once.
	if got := ev["a:1"].Responses; got != float64(flushed) {
		t.Fatalf("the intake counts %v responses; %d were reported (%d sends, every third answer lost)", got, flushed, svc.n.Load())
	}
}
