package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/internal/fixedports"
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

// binary is the inferlb binary the tests run, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		flag.Parse()
		if !testing.Short() {
			dir, err := os.MkdirTemp("", "inferlb-demo-test-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			binary = filepath.Join(dir, "inferlb")
			if out, err := exec.Command("go", "build", "-o", binary, "github.com/inferlb/inferlb/cmd/inferlb").CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
				return 1
			}
		}
		return m.Run()
	}())
}

// demoProc is `inferlb demo` running as a user runs it: in a directory that
// has the repository's examples/, so its default --fleet and --out work.
type demoProc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan error
	dir  string
}

func startDemo(t *testing.T, args ...string) *demoProc {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the whole demo")
	}
	fixedports.Lock(t)
	dir := t.TempDir()
	examples, err := filepath.Abs("../../examples")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(examples, filepath.Join(dir, "examples")); err != nil {
		t.Fatal(err)
	}
	d := &demoProc{out: &syncBuffer{}, done: make(chan error, 1), dir: dir}
	d.cmd = exec.Command(binary, append([]string{"demo"}, args...)...)
	d.cmd.Dir = dir
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			d.cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("demo output:\n%s", d.out.String())
			for _, name := range []string{"control-plane", "loadgen", "engines"} {
				if b, err := os.ReadFile(filepath.Join(dir, "demo-out", name+".log")); err == nil {
					t.Logf("%s.log (last 3 KB):\n%s", name, lastBytes(b, 3000))
				}
			}
		}
	})
	return d
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// wait waits for the demo to exit by itself within timeout.
func (d *demoProc) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-d.done:
		d.done <- err // for the cleanup
		return err
	case <-time.After(timeout):
		t.Fatalf("the demo did not exit within %v", timeout)
		return nil
	}
}

// liveNumbers matches a live view line of a frontend that is up and
// carrying traffic (a request rate that is not 0.0).
var liveNumbers = regexp.MustCompile(`(?m)^frontend-(us-east|us-west|eu-west)\s+up\s+([0-9]*[1-9][0-9]*\.[0-9]|0\.[1-9])\s`)

// The README's first command as a new user runs it: `make demo` with no
// flags shows live numbers and runs until Ctrl-C, which stops it cleanly
// and prints the summary per priority and region and the admin URLs.
func TestDemoDefaultFlagsRunsUntilInterrupted(t *testing.T) {
	defer leaktest.AfterTest(t)()
	d := startDemo(t)
	if err := envoytest.Poll(context.Background(), 3*time.Minute, 500*time.Millisecond, func() error {
		select {
		case err := <-d.done:
			d.done <- err
			return fmt.Errorf("the demo exited by itself (%v) before Ctrl-C", err)
		default:
		}
		if !liveNumbers.MatchString(d.out.String()) {
			return errors.New("no live numbers yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(t, time.Minute); err != nil {
		t.Fatalf("after Ctrl-C the demo exited with %v, want 0", err)
	}
	out := d.out.String()
	for _, want := range []string{"inferlb demo: stopped.", "requests: ", "priority=critical", "priority=batch",
		"region=us-east", "region=eu-west", "http://127.0.0.1:17001: /weights, /explain"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output after Ctrl-C lacks %q", want)
		}
	}
}

// --duration bounds the traffic: the demo ends by itself with the summary,
// every component up throughout, traffic through every frontend, no errors,
// and multi-turn conversations served from the prefix cache.
func TestDemoDurationEndsWithASummary(t *testing.T) {
	defer leaktest.AfterTest(t)()
	d := startDemo(t, "--duration", "20s", "--time-scale", "0.5", "--rate", "3", "--surge-after", "10s",
		"--control-interval", "1s", "--plain")
	if err := d.wait(t, 3*time.Minute); err != nil {
		t.Fatalf("demo: %v", err)
	}
	out := d.out.String()
	b, err := os.ReadFile(filepath.Join(d.dir, "demo-out", "loadgen-report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Requests struct {
			Sent, OK, Errors, Timeouts int
			Rejected                   int `json:"rejected_429"`
		} `json:"requests"`
		CachedShare float64 `json:"cached_prompt_share"`
		Interrupted bool    `json:"interrupted"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("demo traffic: %+v, cached share %.2f", rep.Requests, rep.CachedShare)
	if rep.Requests.OK < 10 || rep.Requests.Errors != 0 || rep.Requests.Timeouts != 0 || rep.Interrupted {
		t.Errorf("want at least 10 good requests, no errors, a run that ended by its bound: %+v", rep)
	}
	// Multi-turn conversations keep landing where their prefix is cached.
	if rep.CachedShare < 0.3 {
		t.Errorf("cached prompt share %.2f: want ≥ 0.3 with session affinity", rep.CachedShare)
	}
	for _, fe := range []string{"frontend-us-east", "frontend-us-west", "frontend-eu-west"} {
		if !regexp.MustCompile(`(?m)^` + fe + `\s+up\s`).MatchString(out) {
			t.Errorf("the live view never showed %s up", fe)
		}
	}
	for _, want := range []string{"class general:", "timeline: ", "inferlb demo: stopped.", fmt.Sprintf("requests: %d sent", rep.Requests.Sent), "region=us-west"} {
		if !strings.Contains(out, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
}
