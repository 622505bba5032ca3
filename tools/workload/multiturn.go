package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inferlb/inferlb/internal/tokens"
	"github.com/inferlb/inferlb/internal/words"
)

// Range is an inclusive integer range [Min, Max], drawn uniformly.
type Range struct{ Min, Max int }

func (r Range) draw(rng *rand.Rand) int {
	if r.Max <= r.Min {
		return r.Min
	}
	return r.Min + rng.IntN(r.Max-r.Min+1)
}

func (r Range) valid(name string, lo int) error {
	if r.Min < lo || r.Max < r.Min {
		return fmt.Errorf("multiturn: %s [%d, %d] invalid (want %d ≤ min ≤ max)", name, r.Min, r.Max, lo)
	}
	return nil
}

// ParseRange parses "N" or "MIN-MAX".
func ParseRange(s string) (Range, error) {
	lo, hi, found := strings.Cut(strings.TrimSpace(s), "-")
	a, err := strconv.Atoi(strings.TrimSpace(lo))
	if err != nil {
		return Range{}, fmt.Errorf("range %q: want N or MIN-MAX", s)
	}
	if !found {
		return Range{a, a}, nil
	}
	b, err := strconv.Atoi(strings.TrimSpace(hi))
	if err != nil || b < a {
		return Range{}, fmt.Errorf("range %q: want N or MIN-MAX with MIN ≤ MAX", s)
	}
	return Range{a, b}, nil
}

// Share is a named weight (a priority or a region and its share of demand).
type Share struct {
	Name   string
	Weight float64
}

// ParseShares parses "a=0.7,b=0.3" (weights need not sum to 1; they are
// normalized). Names must be distinct, weights ≥ 0 and not all zero.
func ParseShares(s string) ([]Share, error) {
	var out []Share
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		name, w, ok := strings.Cut(strings.TrimSpace(part), "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("shares %q: %q is not NAME=WEIGHT", s, part)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(w), 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Errorf("shares %q: weight of %q must be a number ≥ 0", s, name)
		}
		if seen[name] {
			return nil, fmt.Errorf("shares %q: %q appears twice", s, name)
		}
		seen[name] = true
		out = append(out, Share{name, v})
	}
	if err := validShares(out); err != nil {
		return nil, fmt.Errorf("shares %q: %w", s, err)
	}
	return out, nil
}

func validShares(sh []Share) error {
	sum := 0.0
	for _, x := range sh {
		if x.Weight < 0 || math.IsNaN(x.Weight) || math.IsInf(x.Weight, 0) {
			return fmt.Errorf("weight of %q must be a finite number ≥ 0", x.Name)
		}
		sum += x.Weight
	}
	if sum <= 0 {
		return fmt.Errorf("weights sum to zero")
	}
	return nil
}

func pick(sh []Share, rng *rand.Rand) string {
	if len(sh) == 0 {
		return ""
	}
	return pickAt(sh, rng.Float64())
}

// pickAt is the share that u ∈ [0, 1) falls in (the shares laid end to end).
func pickAt(sh []Share, u float64) string {
	if len(sh) == 0 {
		return ""
	}
	sum := 0.0
	for _, x := range sh {
		sum += x.Weight
	}
	u *= sum
	for _, x := range sh {
		if u < x.Weight {
			return x.Name
		}
		u -= x.Weight
	}
	return sh[len(sh)-1].Name
}

// RegionPhase gives the regions' shares of new sessions from At on (until the
// next phase). A phase whose shares move demand to one region is a surge.
type RegionPhase struct {
	At     time.Duration
	Shares []Share
}

// ParseRegionPhase parses "AT:region=w,region=w", e.g. "60s:eu-west=0.8,us-east=0.2".
// Without "AT:" the phase starts at 0.
func ParseRegionPhase(s string) (RegionPhase, error) {
	at := time.Duration(0)
	rest := s
	if before, after, ok := strings.Cut(s, ":"); ok {
		d, err := time.ParseDuration(strings.TrimSpace(before))
		if err != nil || d < 0 {
			return RegionPhase{}, fmt.Errorf("region phase %q: %q is not a duration ≥ 0 (like 60s)", s, before)
		}
		at, rest = d, after
	}
	sh, err := ParseShares(rest)
	if err != nil {
		return RegionPhase{}, fmt.Errorf("region phase %q: %w", s, err)
	}
	return RegionPhase{At: at, Shares: sh}, nil
}

// MultiTurnOptions shape synthetic multi-turn conversations.
type MultiTurnOptions struct {
	// Format must be Chat (a conversation is a list of messages).
	Format Format
	// SystemPrompts is the number of distinct system prompts sessions share
	// (default 4); SystemPromptTokens their length in tokens (default 400).
	SystemPrompts      int
	SystemPromptTokens int
	// Turns per session (default 2–6).
	Turns Range
	// UserTokens per user message (default 50–200) and OutputTokens per answer
	// (max_tokens, default 50–200).
	UserTokens   Range
	OutputTokens Range
	// ThinkTime is the mean of the exponential wait between an answer and the
	// next turn (0: no wait).
	ThinkTime time.Duration
	// SessionIDs sets Request.SessionID (the load generator sends it as a
	// header); without it sessions still exist but are anonymous.
	SessionIDs bool
	// Priorities is the priority mix of sessions (empty: no priority).
	Priorities []Share
	// Regions are the regions' shares of new sessions over time, phases in
	// order of At, the first at 0 (empty: no region).
	Regions []RegionPhase
	// Seed makes the workload reproducible.
	Seed uint64

	// Preambles, when positive, is the number of distinct long preambles
	// sessions share; each is PreambleTokens long (drawn once per preamble)
	// and begins the session's first user message, before the session's own
	// words: the shape of traffic where every prompt starts with the same
	// document or instructions inside the user turn (a prefix hash over the
	// first user message sees only the preamble).
	Preambles      int
	PreambleTokens Range
	// ToolTokens, when set, makes sessions agentic tool loops: after the
	// first user message every turn adds the assistant's answer and a tool
	// result of ToolTokens words (role "tool") instead of a user message.
	ToolTokens Range
}

// MultiTurn produces synthetic chat sessions. Every session picks one of a
// few shared system prompts, a priority and a region (by the shares in force
// at its start); each turn sends the whole conversation so far plus a new
// user message, so turn k+1's prompt extends turn k's prompt by the answer to
// turn k and the new message.
type MultiTurn struct {
	opt          MultiTurnOptions
	systems      []string
	systemTokens []int // each system message's tokens (role marker included)
	preambles    []string

	mu   sync.Mutex
	rng  *rand.Rand
	next int
}

// NewMultiTurn validates opt (filling defaults) and returns a source.
func NewMultiTurn(opt MultiTurnOptions) (*MultiTurn, error) {
	if opt.Format != Chat {
		return nil, fmt.Errorf("multiturn: format must be chat")
	}
	if opt.SystemPrompts == 0 {
		opt.SystemPrompts = 4
	}
	if opt.SystemPromptTokens == 0 {
		opt.SystemPromptTokens = 400
	}
	if opt.Turns == (Range{}) {
		opt.Turns = Range{2, 6}
	}
	if opt.UserTokens == (Range{}) {
		opt.UserTokens = Range{50, 200}
	}
	if opt.OutputTokens == (Range{}) {
		opt.OutputTokens = Range{50, 200}
	}
	switch {
	case opt.SystemPrompts < 1 || opt.SystemPrompts > 1000:
		return nil, fmt.Errorf("multiturn: system prompts %d out of range [1, 1000]", opt.SystemPrompts)
	case opt.SystemPromptTokens < 1 || opt.SystemPromptTokens > maxTraceTokens:
		return nil, fmt.Errorf("multiturn: system prompt tokens %d out of range [1, %d]", opt.SystemPromptTokens, maxTraceTokens)
	case opt.ThinkTime < 0:
		return nil, fmt.Errorf("multiturn: think time %v is negative", opt.ThinkTime)
	}
	for _, c := range []struct {
		name string
		r    Range
	}{{"turns", opt.Turns}, {"user tokens", opt.UserTokens}, {"output tokens", opt.OutputTokens}} {
		if err := c.r.valid(c.name, 1); err != nil {
			return nil, err
		}
	}
	if opt.Preambles < 0 || opt.Preambles > 1000 {
		return nil, fmt.Errorf("multiturn: preambles %d out of range [0, 1000]", opt.Preambles)
	}
	if opt.Preambles > 0 {
		if err := opt.PreambleTokens.valid("preamble tokens", 1); err != nil {
			return nil, err
		}
		if opt.PreambleTokens.Max > maxTraceTokens {
			return nil, fmt.Errorf("multiturn: preamble tokens %d above %d", opt.PreambleTokens.Max, maxTraceTokens)
		}
	}
	if opt.ToolTokens != (Range{}) {
		if err := opt.ToolTokens.valid("tool tokens", 1); err != nil {
			return nil, err
		}
	}
	if len(opt.Priorities) > 0 {
		if err := validShares(opt.Priorities); err != nil {
			return nil, fmt.Errorf("multiturn: priorities: %w", err)
		}
	}
	opt.Regions = slices.Clone(opt.Regions)
	sort.SliceStable(opt.Regions, func(i, j int) bool { return opt.Regions[i].At < opt.Regions[j].At })
	for i, ph := range opt.Regions {
		if err := validShares(ph.Shares); err != nil {
			return nil, fmt.Errorf("multiturn: region phase at %v: %w", ph.At, err)
		}
		if i > 0 && ph.At == opt.Regions[i-1].At {
			return nil, fmt.Errorf("multiturn: two region phases start at %v", ph.At)
		}
	}
	if len(opt.Regions) > 0 && opt.Regions[0].At != 0 {
		return nil, fmt.Errorf("multiturn: the first region phase starts at %v, want 0s", opt.Regions[0].At)
	}
	m := &MultiTurn{opt: opt, rng: rand.New(rand.NewPCG(opt.Seed, 0x6d756c7469))}
	for i := 0; i < opt.SystemPrompts; i++ {
		m.systems = append(m.systems, words.Words(mix64(opt.Seed^mix64(uint64(i)+0x737973)), opt.SystemPromptTokens))
		m.systemTokens = append(m.systemTokens, tokens.CountChat([]tokens.Message{{Role: "system", Content: m.systems[i]}}))
	}
	prng := rand.New(rand.NewPCG(opt.Seed, 0x7072656d))
	for i := 0; i < opt.Preambles; i++ {
		m.preambles = append(m.preambles, words.Words(mix64(opt.Seed^mix64(uint64(i)+0x707265)), opt.PreambleTokens.draw(prng)))
	}
	return m, nil
}

// Timed reports false: sessions start when the caller asks.
func (m *MultiTurn) Timed() bool { return false }

// Preamble returns preamble i (for tests and tools).
func (m *MultiTurn) Preamble(i int) string { return m.preambles[i] }

// SystemPrompt returns system prompt i (for tests and tools).
func (m *MultiTurn) SystemPrompt(i int) string { return m.systems[i] }

// RegionSharesAt returns the region shares in force at t.
func (m *MultiTurn) RegionSharesAt(t time.Duration) []Share {
	var cur []Share
	for _, ph := range m.opt.Regions {
		if ph.At > t {
			break
		}
		cur = ph.Shares
	}
	return cur
}

// Next starts a new session, sent at time at, and returns its first turn.
func (m *MultiTurn) Next(at time.Duration) (Request, bool) {
	m.mu.Lock()
	idx := m.next
	m.next++
	seed := m.rng.Uint64()
	sys := m.rng.IntN(len(m.systems))
	turns := m.opt.Turns.draw(m.rng)
	prio := pick(m.opt.Priorities, m.rng)
	region := pick(m.RegionSharesAt(at), m.rng)
	pre := ""
	if len(m.preambles) > 0 {
		pre = m.preambles[m.rng.IntN(len(m.preambles))]
	}
	m.mu.Unlock()
	r := Request{
		Index:    idx,
		Turns:    turns,
		Priority: prio,
		Region:   region,
		seed:     seed,
		Messages: []tokens.Message{{Role: "system", Content: m.systems[sys]}},
	}
	r.PromptTokens = m.systemTokens[sys]
	if m.opt.SessionIDs {
		r.SessionID = fmt.Sprintf("s%016x", seed)
	}
	m.addTurn(&r)
	if pre != "" {
		u := &r.Messages[len(r.Messages)-1]
		u.Content = pre + " " + u.Content
		r.PromptTokens = tokens.CountChat(r.Messages)
	}
	return r, true
}

// addTurn advances r to its next turn: a new user message, max tokens and
// think time drawn from the session's own random stream (so a session's
// content does not depend on how the caller interleaves sessions).
func (m *MultiTurn) addTurn(r *Request) {
	r.Turn++
	rng := rand.New(rand.NewPCG(r.seed, uint64(r.Turn)))
	msg, n := tokens.Message{Role: "user"}, 0
	if r.Turn > 1 && m.opt.ToolTokens != (Range{}) {
		msg.Role, n = "tool", m.opt.ToolTokens.draw(rng)
	} else {
		n = m.opt.UserTokens.draw(rng)
	}
	msg.Content = words.Words(rng.Uint64(), n)
	r.Messages = append(r.Messages, msg)
	r.MaxTokens = m.opt.OutputTokens.draw(rng)
	r.ThinkTime = 0
	if m.opt.ThinkTime > 0 {
		r.ThinkTime = time.Duration(rng.ExpFloat64() * float64(m.opt.ThinkTime))
	}
	// The prompt grows by the new message: its role marker and n words,
	// one token each (a session's history is not counted again).
	r.PromptTokens += 1 + n
}

// FollowUp returns the turn after prev, whose answer was answer: prev's
// messages, the answer as an assistant message, and a new user message. ok is
// false after the session's last turn.
func (m *MultiTurn) FollowUp(prev Request, answer string) (Request, bool) {
	if prev.Turn >= prev.Turns {
		return Request{}, false
	}
	next := prev
	next.Messages = make([]tokens.Message, len(prev.Messages), len(prev.Messages)+2)
	copy(next.Messages, prev.Messages)
	next.Messages = append(next.Messages, tokens.Message{Role: "assistant", Content: answer})
	next.PromptTokens += tokens.CountChat(next.Messages[len(next.Messages)-1:])
	m.addTurn(&next)
	return next, true
}
