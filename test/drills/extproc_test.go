package drills

import (
	"context"
	"fmt"
	"testing"
	"time"

	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/internal/envoytest"
)

// Item 5: ext_proc is SIGKILLed while streams are flowing. Streams whose
// routing decision is made must finish, in either failure mode: 0 cut.
// While it is down, new requests get 503 no_routing_decision (fail-closed)
// or take the fallback route (fail-open); once it is back, requests are
// decided again.
func TestDrillExtProcDeath(t *testing.T) {
	for _, variant := range []string{envoyconfigs.FailClosed, envoyconfigs.FailOpen} {
		t.Run(variant, func(t *testing.T) {
			s := startStack(t, stackOptions{variant: variant})
			// Streams of 120 tokens × ~25 ms: about 3 s each, so that
			// several are mid-stream when ext_proc dies, at 60% of the
			// fleet's capacity (no shedding).
			tr := s.startTraffic(trafficOptions{rate: 2.5, maxTokens: 120})
			// Requests whose response head arrived before the kill have
			// their routing decision (Envoy sent them upstream after it).
			// Not an age: on a starved machine a request may wait longer
			// than any threshold for ext_proc, and fail-closed then
			// answers 503 to a stream that had no decision yet. Kill when
			// at least 6 of them are in flight.
			var inflight map[int]bool
			if err := envoytest.Poll(context.Background(), 30*time.Second, 20*time.Millisecond, func() error {
				if inflight = tr.answeredInFlight(); len(inflight) < 6 {
					return fmt.Errorf("%d decided requests in flight", len(inflight))
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			s.procs.Kill(s.ext)
			downFrom := time.Now()
			t.Logf("ext_proc killed with %d decided requests in flight", len(inflight))
			tr.waitSent(t, tr.sentCount()+4, 10*time.Second) // a few arrive while it is down

			// New requests while it is down.
			c := newClient(s.url)
			defer c.close()
			down := c.do(context.Background(), request{prompt: "while ext_proc is down", maxTokens: 2, priority: "high"})
			switch variant {
			case envoyconfigs.FailClosed:
				if down.outcome != outcomeFailed || down.status != 503 {
					t.Errorf("fail-closed, ext_proc down: new request %s, want 503", down)
				}
			case envoyconfigs.FailOpen:
				if down.outcome != outcomeOK {
					t.Errorf("fail-open, ext_proc down: new request %s, want 200 by the fallback route", down)
				}
			}

			// Back again: decisions resume.
			downTo := time.Now()
			if err := s.procs.Restart(s.ext); err != nil {
				t.Fatal(err)
			}
			if err := envoytest.Poll(context.Background(), 30*time.Second, 100*time.Millisecond, func() error {
				if _, err := get("http://" + s.extHTTP + "/healthz"); err != nil {
					return err
				}
				if r := c.do(context.Background(), request{prompt: "ext_proc is back", maxTokens: 2, priority: "high"}); r.outcome != outcomeOK {
					return fmt.Errorf("after restart: %s", r)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			tally := tr.stop()
			before := tr.tallyOf(inflight)
			during := tr.tally(downFrom, downTo)
			t.Logf("%s: requests in flight at the kill: %s", variant, before)
			t.Logf("%s: requests sent while ext_proc was down: %s", variant, during)
			t.Logf("%s: whole run: %s", variant, tally)
			if variant == envoyconfigs.FailOpen && during.all.ok != during.sent {
				t.Errorf("fail-open: requests sent while ext_proc was down did not all take the fallback route: %s", during)
			}
			if len(inflight) < 6 {
				t.Fatalf("only %d requests in flight at the kill: the drill proves nothing", len(inflight))
			}
			if before.all.cut != 0 || before.all.failed != 0 {
				t.Errorf("%s: streams whose routing decision was made were lost when ext_proc died: %s", variant, before)
			}
		})
	}
}
