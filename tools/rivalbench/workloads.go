package rivalbench

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/inferlb/inferlb/tools/loadgen"
	"github.com/inferlb/inferlb/tools/workload"
)

// Workload is one traffic shape of the bench. Every router of a run gets
// its own source built from the same settings and seed, so each sees the
// same requests at the same offsets.
type Workload struct {
	Name string
	// About says what the traffic is, for the table's heading.
	About string
	// build returns a fresh source and its arrivals for one run: run
	// numbers the runs from 0 (trace windows move with it), d bounds the
	// traffic.
	build func(o Options, run int) (workload.Source, loadgen.Arrival, error)
	// FollowUps says whether requests continue conversations (the history
	// measure applies).
	FollowUps bool
}

// The workloads. Each runs at a load where round robin's engines queue on
// the bench's fleet (4 H100 engines serving an 8B model per router).
var Workloads = []Workload{
	{Name: "mooncake", About: "windows of Mooncake's synthetic trace (prompts sharing chained 512-token blocks), replayed at 2x",
		build: mooncakeWindow},
	{Name: "multiturn", About: "multi-turn chats on 8 shared 4k-token system prompts, no session ids",
		build: multiTurn(false), FollowUps: true},
	{Name: "multiturn-sessions", About: "the same chats, each sending its session id in x-session-id",
		build: multiTurn(true), FollowUps: true},
	{Name: "agentic", About: "tool loops on a growing context: a 2k-token system prompt of 4, each step adds the answer and a 300-900-token tool result",
		build: agentic, FollowUps: true},
	{Name: "rag", About: "retrieval: a per-user instruction prompt (of 200), one of 50 3k-token documents, a question; 1-3 turns",
		build: rag, FollowUps: true},
	{Name: "azure-conv", About: "Azure's conversation trace (real sizes and arrivals, no shared prefixes), replayed at 2x",
		build: azureConv},
}

// ParseWorkloads reads a comma-separated list of workload names ("all").
func ParseWorkloads(s string) ([]Workload, error) {
	if strings.TrimSpace(s) == "all" {
		return Workloads, nil
	}
	var out []Workload
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		found := false
		for _, w := range Workloads {
			if w.Name == name {
				out, found = append(out, w), true
			}
		}
		if !found {
			var names []string
			for _, w := range Workloads {
				names = append(names, w.Name)
			}
			return nil, fmt.Errorf("unknown workload %q (want all, or some of %s)", name, strings.Join(names, ", "))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no workload to run")
	}
	return out, nil
}

// mooncakeSpeedup is how much faster than its timestamps the Mooncake
// window is replayed.
const mooncakeSpeedup = 2

// mooncakeWindow replays run's window of the trace: the rows whose
// timestamps fall in [run·W, (run+1)·W) for W = Duration × speedup, moved to
// start at 0, so each run of a median sees other prompts.
func mooncakeWindow(o Options, run int) (workload.Source, loadgen.Arrival, error) {
	rows, err := workload.LoadMooncake(filepath.Join(o.DataDir, "mooncake_synthetic_trace.jsonl"))
	if err != nil {
		return nil, loadgen.Arrival{}, err
	}
	w := int64(o.Duration/time.Millisecond) * mooncakeSpeedup
	var win []workload.MooncakeRow
	for _, r := range rows {
		if r.Timestamp >= int64(run)*w && r.Timestamp < int64(run+1)*w {
			r.Timestamp -= int64(run) * w
			win = append(win, r)
		}
	}
	if len(win) == 0 {
		return nil, loadgen.Arrival{}, fmt.Errorf("mooncake: run %d's window of %v is past the trace's end", run+1, time.Duration(w)*time.Millisecond)
	}
	src, err := workload.NewMooncake(win, workload.MooncakeOptions{BlockTokens: workload.MooncakeBlockTokens, Seed: o.Seed, MaxOutputTokens: 256})
	return src, loadgen.Arrival{Kind: loadgen.Trace, Speedup: mooncakeSpeedup}, err
}

// azureConv replays run's window of Azure's conversation trace.
func azureConv(o Options, run int) (workload.Source, loadgen.Arrival, error) {
	rows, err := workload.LoadAzure(filepath.Join(o.DataDir, "AzureLLMInferenceTrace_conv.csv"))
	if err != nil {
		return nil, loadgen.Arrival{}, err
	}
	if len(rows) == 0 {
		return nil, loadgen.Arrival{}, fmt.Errorf("azure-conv: the trace is empty")
	}
	const speedup = 2
	w := o.Duration * speedup
	t0 := rows[0].Time.Add(time.Duration(run) * w)
	var win []workload.AzureRow
	for _, r := range rows {
		if !r.Time.Before(t0) && r.Time.Before(t0.Add(w)) {
			win = append(win, r)
		}
	}
	if len(win) == 0 {
		return nil, loadgen.Arrival{}, fmt.Errorf("azure-conv: run %d's window is past the trace's end", run+1)
	}
	src, err := workload.NewAzure(win, workload.AzureOptions{Seed: o.Seed + uint64(run)})
	return src, loadgen.Arrival{Kind: loadgen.Trace, Speedup: speedup}, err
}

// multiTurn is the chat workload of the rivals' issue: 8 shared 4k-token
// system prompts, 3-8 turns, 1 s think time, new sessions at a rate where
// round robin queues.
func multiTurn(sessionIDs bool) func(Options, int) (workload.Source, loadgen.Arrival, error) {
	return func(o Options, run int) (workload.Source, loadgen.Arrival, error) {
		src, err := workload.NewMultiTurn(workload.MultiTurnOptions{
			SystemPrompts: 8, SystemPromptTokens: 4096,
			Turns: workload.Range{Min: 3, Max: 8}, UserTokens: workload.Range{Min: 100, Max: 400},
			OutputTokens: workload.Range{Min: 100, Max: 300}, ThinkTime: time.Second,
			SessionIDs: sessionIDs, Seed: o.Seed + uint64(run),
		})
		return src, loadgen.Arrival{Kind: loadgen.Poisson, Rate: 3 * o.Load}, err
	}
}

// agentic is a tool loop: each step resends the growing context with the
// last answer and a tool result.
func agentic(o Options, run int) (workload.Source, loadgen.Arrival, error) {
	src, err := workload.NewMultiTurn(workload.MultiTurnOptions{
		SystemPrompts: 4, SystemPromptTokens: 2048,
		Turns: workload.Range{Min: 4, Max: 10}, UserTokens: workload.Range{Min: 100, Max: 300},
		OutputTokens: workload.Range{Min: 50, Max: 200}, ToolTokens: workload.Range{Min: 300, Max: 900},
		ThinkTime: 200 * time.Millisecond, Seed: o.Seed + uint64(run),
	})
	return src, loadgen.Arrival{Kind: loadgen.Poisson, Rate: 2 * o.Load}, err
}

// rag is retrieval-augmented chat: the user's own instructions (a system
// prompt of one of 200 users), then one of 50 long documents and a question
// in the first user message; the document is shared across users but is
// not a prefix across them.
func rag(o Options, run int) (workload.Source, loadgen.Arrival, error) {
	src, err := workload.NewMultiTurn(workload.MultiTurnOptions{
		SystemPrompts: 200, SystemPromptTokens: 300,
		Preambles: 50, PreambleTokens: workload.Range{Min: 2500, Max: 3500},
		Turns: workload.Range{Min: 1, Max: 3}, UserTokens: workload.Range{Min: 30, Max: 100},
		OutputTokens: workload.Range{Min: 100, Max: 300}, ThinkTime: time.Second,
		Seed: o.Seed + uint64(run),
	})
	return src, loadgen.Arrival{Kind: loadgen.Poisson, Rate: 5 * o.Load}, err
}
