package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
)

// syncBuffer is a bytes.Buffer safe for the view goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// freeBase finds n consecutive free loopback ports below the kernel's
// ephemeral range: tests of other packages running at the same time take
// their ports (listeners on :0, outgoing connections) from that range, and
// one could land on a demo port between this check and the demo's bind.
func freeBase(t *testing.T, n int) int {
	t.Helper()
	lo, hi := 10000, 60000
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var eph0, eph1 int
		if _, err := fmt.Sscan(string(b), &eph0, &eph1); err == nil && eph0-n > lo+1000 {
			hi = eph0 - n
		}
	}
	span := (hi - lo) / 10
	for base := lo + os.Getpid()%span*10/2; base < hi; base += 97 {
		ok := true
		for p := base; p < base+n && ok; p++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				ok = false
				continue
			}
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free port range")
	return 0
}

// A surge in a region no frontend serves is refused before anything
// starts, not run as a demo without a surge.
func TestDemoRejectsUnknownSurgeRegion(t *testing.T) {
	dir := t.TempDir()
	_, err := Run(context.Background(), Options{FleetPath: "../../examples/fleet-3region.yaml", OutDir: filepath.Join(dir, "out"),
		Duration: time.Second, TimeScale: 1, Rate: 1, SurgeAfter: time.Second, SurgeRegion: "us-esat",
		ControlInterval: time.Second, ViewInterval: time.Second, BasePort: 30000})
	if err == nil || !strings.Contains(err.Error(), `surge region "us-esat" has no frontend`) {
		t.Fatalf("err = %v, want the unknown surge region named", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "out")); !os.IsNotExist(err) {
		t.Errorf("the refused demo created its output directory (stat: %v)", err)
	}
}

// The README's first command, end to end: every component as its own
// process, real Envoys, traffic through every frontend, nothing failing, and
// a live view that shows every frontend up with traffic.
func TestDemoRunsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs the whole demo")
	}
	defer leaktest.AfterTest(t)()
	dir := t.TempDir()
	bin := filepath.Join(dir, "inferlb")
	build := exec.Command("go", "build", "-o", bin, "github.com/inferlb/inferlb/cmd/inferlb")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// The example fleet with its engines moved to free ports, so the test
	// does not collide with a demo the developer is running.
	src, err := os.ReadFile("../../examples/fleet-3region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	base := freeBase(t, 100)
	re := regexp.MustCompile(`127\.0\.0\.1:180(\d\d)`)
	fleetYAML := re.ReplaceAllStringFunc(string(src), func(m string) string {
		var k int
		fmt.Sscanf(m[len("127.0.0.1:180"):], "%d", &k)
		return fmt.Sprintf("127.0.0.1:%d", base+60+k)
	})
	fleetPath := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(fleetPath, []byte(fleetYAML), 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var view syncBuffer
	res, err := Run(ctx, Options{
		FleetPath: fleetPath, OutDir: filepath.Join(dir, "out"), Self: bin,
		Duration: 12 * time.Second, TimeScale: 0.5, Rate: 3,
		SurgeAfter: 6 * time.Second, SurgeRegion: "us-east",
		ControlInterval: time.Second, ViewInterval: 2 * time.Second, View: &view, Plain: true,
		BasePort: base,
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(res.LoadgenReport)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Requests struct {
			Sent, OK, Errors, Timeouts int
			Rejected                   int `json:"rejected_429"`
		} `json:"requests"`
		CachedShare float64 `json:"cached_prompt_share"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("demo traffic: %+v, cached share %.2f", rep.Requests, rep.CachedShare)
	if rep.Requests.OK < 10 || rep.Requests.Errors != 0 || rep.Requests.Timeouts != 0 {
		t.Fatalf("want at least 10 good requests and no errors: %+v\n%s", rep.Requests, view.String())
	}
	// Multi-turn conversations keep landing where their prefix is cached.
	if rep.CachedShare < 0.3 {
		t.Errorf("cached prompt share %.2f: want ≥ 0.3 with session affinity", rep.CachedShare)
	}
	out := view.String()
	for _, fe := range []string{"frontend-us-east: up", "frontend-us-west: up", "frontend-eu-west: up"} {
		if !strings.Contains(out, fe) {
			t.Errorf("live view never showed %q:\n%s", fe, out)
		}
	}
}
