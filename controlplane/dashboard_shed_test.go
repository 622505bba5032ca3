package controlplane

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/internal/envoytest"
)

// checkObservedShed: an ext_proc instance of fe-east reports that it
// answered 2 of every 5 low-priority chat requests 429 (its local
// guardrail), 50 requests/s on top of the rig's own demand, well within
// what the fleet serves (at 100/s the plan itself began to shed the low
// priority on a loaded machine, which is right, but not this check); the heatmap's "shed
// observed" column shows it beside the planned column, which stays empty,
// so a person sees why clients get 429s.
func checkObservedShed(ctx context.Context, t *testing.T, tab context.Context, rig *adminRig) {
	t.Helper()
	xds, _, err := rig.runner.Addrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(xds, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Add(1)
	go func() {
		defer wg.Done()
		c := policyv1.NewReportsClient(conn)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-rctx.Done():
				return
			case now := <-tick.C:
				_, err := c.Report(rctx, &policyv1.ReportRequest{NodeId: "fe-east", Instance: "guardrail",
					IntervalStart: timestamppb.New(last), IntervalEnd: timestamppb.New(now),
					Demand: []*policyv1.DemandSample{{Class: "chat", Priority: "low", Requests: 5, Shed: 2, PromptTokens: 1000, OutputTokens: 1000}}})
				if err == nil {
					last = now
				}
			}
		}
	}()
	var planned, observed string
	if err := envoytest.Poll(ctx, 30*time.Second, 200*time.Millisecond, func() error {
		raw, err := chromedp.Run(tab, chromedp.Evaluate[[]string](`[
			document.querySelector('table.heatmap td.shed.planned[data-node="fe-east"][data-class="chat"]').textContent,
			document.querySelector('table.heatmap td.shed.observed[data-node="fe-east"][data-class="chat"]').textContent]`))
		if err != nil {
			return err
		}
		planned, observed = raw[0], raw[1]
		if observed != "low 40.0%" {
			return fmt.Errorf("fe-east's observed shed shows %q, want low 40.0%%", observed)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(planned, "low") {
		t.Errorf("planned shed %q at a demand the fleet serves", planned)
	}
	t.Logf("fe-east chat: shed planned %q, observed %q", planned, observed)
}
