package drills

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
)

// Slow-loris bodies (a Content-Length the client never finishes sending)
// must be answered 408, not 503 no_routing_decision. Here 400 connections
// each send half a body and stall (the ext_proc stream of each open from
// its headers); with an 8-s request timeout every one must get 408, while
// real traffic goes on without a failure.
//
// This drill guards the outcome only: the 503s have been seen at far more
// connections than it opens, and their cause is still open
// (docs/operations.md).
func TestDrillSlowLoris(t *testing.T) {
	s := startStack(t, stackOptions{envoy: func(p *envoyconfigs.Params) { p.RequestTimeout = "8s" }})
	tr := s.startTraffic(trafficOptions{rate: 4, maxTokens: 8})
	tr.waitSent(t, 8, 20*time.Second)

	const conns = 400
	body := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"slow loris"}]}`
	addr := strings.TrimPrefix(s.url, "http://")
	var mu sync.Mutex
	statuses := map[string]int{}
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status := func() string {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					return "dial error"
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: drill\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
					len(body), body[:len(body)/2])
				if _, err := io.WriteString(c, req); err != nil {
					return "write error"
				}
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return "no status"
				}
				if f := strings.Fields(line); len(f) >= 2 {
					return f[1]
				}
				return strings.TrimSpace(line)
			}()
			mu.Lock()
			statuses[status]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	took := time.Since(start)
	tally := tr.stop()
	var keys []string
	for k := range statuses {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: %d", k, statuses[k]))
	}
	t.Logf("%d stalled bodies answered within %.1f s: %s; traffic meanwhile: %s", conns, took.Seconds(), strings.Join(parts, ", "), tally)
	if statuses["408"] != conns {
		t.Errorf("%d of %d stalled bodies answered 408 (%s), want all", statuses["408"], conns, strings.Join(parts, ", "))
	}
	if tally.all.failed+tally.all.cut != 0 {
		t.Errorf("requests failed beside the slow clients: %s", tally)
	}
}
