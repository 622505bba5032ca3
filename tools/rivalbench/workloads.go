package rivalbench

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/inferlb/inferlb/internal/tokens"
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
	{Name: "mooncake", About: "Mooncake's synthetic trace replayed at 16x, each hash id a 32-token block (prompts sharing chained blocks), outputs capped at 64",
		build: mooncakeWindow},
	{Name: "multiturn", About: "multi-turn chats on 8 shared 4k-token system prompts, 4 new chats/s, no session ids",
		build: multiTurn(false), FollowUps: true},
	{Name: "multiturn-sessions", About: "the same chats, each sending its session id in x-session-id",
		build: multiTurn(true), FollowUps: true},
	{Name: "agentic", About: "tool loops on a growing context: a 2k-token system prompt of 4, each step adds the answer and a 300-900-token tool result",
		build: agentic, FollowUps: true},
	{Name: "rag", About: "retrieval: a per-user instruction prompt (of 200), one of 50 3k-token documents, a question; 1-3 turns",
		build: rag, FollowUps: true},
	{Name: "azure-conv", About: "Azure's conversation trace (real sizes, no shared prefixes), windows replayed at 4x",
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

// The Mooncake replay: mooncakeSpeedup times faster than the trace's
// timestamps, so that a minute covers most of the trace and its prompts
// meet the history they share (a short window of it at its own pace shares
// little); each hash id mooncakeBlockTokens words (the trace's blocks are
// 512 tokens: a sixteenth keeps the prefix structure and the share of
// blocks reused, and the sixteen-fold rate fits the engines); outputs
// capped.
const (
	mooncakeSpeedup     = 16
	mooncakeBlockTokens = 32
	mooncakeMaxOutput   = 64
)

// mooncakeRows is run's window of the trace: the rows whose timestamps fall
// in window k of W = Duration × speedup, [k·W, (k+1)·W), moved to start at
// 0, with k = run+1 modulo the windows the trace holds (the first window's
// prompts have no history before them; with one window, every run replays
// it).
func mooncakeRows(o Options, run int) ([]workload.MooncakeRow, error) {
	rows, err := workload.LoadMooncake(filepath.Join(o.DataDir, "mooncake_synthetic_trace.jsonl"))
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("mooncake: the trace is empty")
	}
	w := int64(o.Duration/time.Millisecond) * mooncakeSpeedup
	windows := max(1, (rows[len(rows)-1].Timestamp+1)/w)
	k := int64(run+1) % windows
	var win []workload.MooncakeRow
	for _, r := range rows {
		if r.Timestamp >= k*w && r.Timestamp < (k+1)*w {
			r.Timestamp -= k * w
			win = append(win, r)
		}
	}
	if len(win) == 0 {
		return nil, fmt.Errorf("mooncake: window %d of %v holds no row", k+1, time.Duration(w)*time.Millisecond)
	}
	return win, nil
}

func mooncakeWindow(o Options, run int) (workload.Source, loadgen.Arrival, error) {
	win, err := mooncakeRows(o, run)
	if err != nil {
		return nil, loadgen.Arrival{}, err
	}
	src, err := workload.NewMooncake(win, workload.MooncakeOptions{BlockTokens: mooncakeBlockTokens, Seed: o.Seed, MaxOutputTokens: mooncakeMaxOutput})
	if err != nil {
		return nil, loadgen.Arrival{}, err
	}
	return nonEmpty{src}, loadgen.Arrival{Kind: loadgen.Trace, Speedup: mooncakeSpeedup}, nil
}

// nonEmpty gives a chat prompt whose only message is empty (a trace row
// shorter than one block, scaled down to the role marker alone) one word:
// SGLang's routers refuse empty message content (400).
type nonEmpty struct{ workload.Source }

func (n nonEmpty) Next(at time.Duration) (workload.Request, bool) {
	r, ok := n.Source.Next(at)
	if ok && len(r.Messages) == 1 && r.Messages[0].Content == "" {
		r.Messages = []tokens.Message{{Role: r.Messages[0].Role, Content: "hello"}}
		r.PromptTokens++
	}
	return r, ok
}

// idealHit is the share of the prompt tokens sent that an unbounded prefix
// cache would serve, for a workload that knows it (Mooncake); 0 otherwise.
func idealHit(o Options, w Workload, run int, sent int) float64 {
	if w.Name != "mooncake" {
		return 0
	}
	win, err := mooncakeRows(o, run)
	if err != nil {
		return 0
	}
	return workload.MooncakeIdeal(win[:min(sent, len(win))], mooncakeBlockTokens).TokenShare()
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
	const speedup = 4
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
		return src, loadgen.Arrival{Kind: loadgen.Poisson, Rate: 4 * o.Load}, err
	}
}

// agentic is a tool loop: each step resends the growing context with the
// last answer and a tool result. The tool results go as user messages: a
// "tool" message without the assistant's tool_calls before it is not valid
// OpenAI chat, and smg refuses it (400).
func agentic(o Options, run int) (workload.Source, loadgen.Arrival, error) {
	src, err := workload.NewMultiTurn(workload.MultiTurnOptions{
		SystemPrompts: 4, SystemPromptTokens: 2048,
		Turns: workload.Range{Min: 4, Max: 10}, UserTokens: workload.Range{Min: 100, Max: 300},
		OutputTokens: workload.Range{Min: 50, Max: 200}, ToolTokens: workload.Range{Min: 300, Max: 900},
		ThinkTime: 200 * time.Millisecond, Seed: o.Seed + uint64(run),
	})
	if err != nil {
		return nil, loadgen.Arrival{}, err
	}
	return toolsAsUser{src}, loadgen.Arrival{Kind: loadgen.Poisson, Rate: 2 * o.Load}, nil
}

// toolsAsUser sends a multi-turn source's tool results as user messages
// (same words, same token count under the token rule).
type toolsAsUser struct{ *workload.MultiTurn }

func (t toolsAsUser) FollowUp(prev workload.Request, answer string) (workload.Request, bool) {
	next, ok := t.MultiTurn.FollowUp(prev, answer)
	if ok {
		for i := range next.Messages {
			if next.Messages[i].Role == "tool" {
				next.Messages[i].Role = "user"
			}
		}
	}
	return next, ok
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
