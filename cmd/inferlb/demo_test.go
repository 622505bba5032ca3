package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/inferlb/inferlb/tools/llamacpp"
)

// The demo's end-to-end checks. The demo runs as users run it, through the
// documented make demo commands of TestDocumentedCommands (one run with the
// default flags until Ctrl-C, one bounded run): these functions are what
// those runs must show, beyond their exit status.

// liveNumbers matches a live view line of a frontend that is up and
// carrying traffic (a request rate that is not 0.0).
var liveNumbers = regexp.MustCompile(`(?m)^frontend-(us-east|us-west|eu-west)\s+up\s+([0-9]*[1-9][0-9]*\.[0-9]|0\.[1-9])\s`)

// make demo with no flags shows live numbers and runs until Ctrl-C, which
// stops it cleanly and prints the summary per priority and region and the
// admin and dashboard URLs.
func checkDemoUntilInterrupted(t *testing.T, out, _ string) {
	if !liveNumbers.MatchString(out) {
		t.Errorf("the live view never showed a frontend with traffic:\n%s", tailString(out, 3000))
	}
	for _, want := range []string{"dashboard: http://127.0.0.1:17001/dashboard/", "inferlb demo: stopped.", "requests: ",
		"priority=critical", "priority=batch", "region=us-east", "region=eu-west",
		"http://127.0.0.1:17001: /weights, /explain", "dashboard at http://127.0.0.1:17001/dashboard/"} {
		if !strings.Contains(out, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
}

// A bounded demo ends by itself with the summary, every component up
// throughout, traffic through every frontend, no errors, and multi-turn
// conversations served from the prefix cache.
func checkDemoBounded(t *testing.T, out, dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "demo-out", "loadgen-report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Requests struct {
			Sent, OK, Errors, Timeouts int
			Rejected                   int `json:"rejected_429"`
		} `json:"requests"`
		CachedShare float64        `json:"cached_prompt_share"`
		Interrupted bool           `json:"interrupted"`
		Messages    map[string]int `json:"errors"` // by message (status and cause)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("demo traffic: %+v, cached share %.2f, errors by message %v", rep.Requests, rep.CachedShare, rep.Messages)
	// What a newcomer relies on is a working system: nearly every request
	// answered. Not zero errors: the demo keeps the product's 1-s ext_proc
	// message timeout (it shows the product as deployed), and on a
	// starved, race-built CI machine one late decision is a 504 that says
	// nothing about the system. A broken component fails many requests,
	// far above max(1, 1% of sent); the errors and their messages are
	// printed so that one that does occur can be read.
	failed := rep.Requests.Errors + rep.Requests.Timeouts
	if allowed := max(1, rep.Requests.Sent/100); rep.Requests.OK < 10 || failed > allowed || rep.Interrupted {
		t.Errorf("want at least 10 good requests, at most %d errors and timeouts (1%% of %d sent, at least 1), a run that ended by its bound: %+v; errors by message: %v",
			allowed, rep.Requests.Sent, rep, rep.Messages)
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

// The llama.cpp demo runs where llama-server is built; outside CI a
// machine without it skips the entry (in CI its absence fails the run).
func init() {
	err := llamacpp.Available()
	if err == nil || os.Getenv("CI") == "true" {
		return
	}
	for i := range docCommands {
		if strings.Contains(docCommands[i].cmd, "--engines llamacpp") {
			docCommands[i].skip = "no llama-server here (" + err.Error() + "); not in CI"
		}
	}
}

// A bounded demo on real llama.cpp servers: every engine up, traffic
// through every frontend, nearly every request answered, and the
// conversations' later turns served from the servers' own prompt caches
// (their usage reports the cached tokens).
func checkDemoLlama(t *testing.T, out, dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "demo-out", "loadgen-report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Requests struct {
			Sent, OK, Errors, Timeouts int
		} `json:"requests"`
		CachedShare float64        `json:"cached_prompt_share"`
		Messages    map[string]int `json:"errors"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("llama.cpp demo traffic: %+v, cached share %.2f, errors by message %v", rep.Requests, rep.CachedShare, rep.Messages)
	if failed := rep.Requests.Errors + rep.Requests.Timeouts; rep.Requests.OK < 5 || failed > max(1, rep.Requests.Sent/100) {
		t.Errorf("want at least 5 good requests and at most 1%% failed: %+v; errors by message: %v", rep.Requests, rep.Messages)
	}
	if rep.CachedShare < 0.2 {
		t.Errorf("cached prompt share %.2f: want ≥ 0.2, the later turns from the servers' prompt caches", rep.CachedShare)
	}
	for _, want := range []string{"us-east-cpu-1", "eu-west-cpu-1", "inferlb demo: stopped."} {
		if !strings.Contains(out, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
}
