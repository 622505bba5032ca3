package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/inferlb/inferlb/internal/words"
)

// MooncakeRow is one request of a Mooncake trace (kvcache-ai/Mooncake,
// FAST'25): JSON Lines of
// {"timestamp": <ms>, "input_length": <tokens>, "output_length": <tokens>, "hash_ids": [...]}.
// Each hash id stands for one 512-token block of the prompt; two requests that
// share a leading run of ids share that prompt prefix.
type MooncakeRow struct {
	Timestamp    int64 `json:"timestamp"`
	InputLength  int   `json:"input_length"`
	OutputLength int   `json:"output_length"`
	HashIDs      []int `json:"hash_ids"`
}

// MooncakeBlockTokens is the trace's block size in tokens.
const MooncakeBlockTokens = 512

// maxTraceTokens bounds token counts read from traces (a sanity limit that
// keeps a corrupt line from asking for gigabytes of prompt).
const maxTraceTokens = 10_000_000

// ParseMooncake reads a Mooncake JSONL trace. Blank lines are skipped. Every
// error names the line. Rows must be in non-decreasing timestamp order.
func ParseMooncake(r io.Reader) ([]MooncakeRow, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	var rows []MooncakeRow
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		var raw struct {
			Timestamp    *int64 `json:"timestamp"`
			InputLength  *int   `json:"input_length"`
			OutputLength *int   `json:"output_length"`
			HashIDs      []int  `json:"hash_ids"`
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("mooncake trace line %d: %w", line, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("mooncake trace line %d: more than one JSON value on the line", line)
		}
		switch {
		case raw.Timestamp == nil:
			return nil, fmt.Errorf("mooncake trace line %d: missing \"timestamp\"", line)
		case raw.InputLength == nil:
			return nil, fmt.Errorf("mooncake trace line %d: missing \"input_length\"", line)
		case raw.OutputLength == nil:
			return nil, fmt.Errorf("mooncake trace line %d: missing \"output_length\"", line)
		case raw.HashIDs == nil:
			return nil, fmt.Errorf("mooncake trace line %d: missing \"hash_ids\"", line)
		}
		row := MooncakeRow{Timestamp: *raw.Timestamp, InputLength: *raw.InputLength, OutputLength: *raw.OutputLength, HashIDs: raw.HashIDs}
		switch {
		case row.Timestamp < 0:
			return nil, fmt.Errorf("mooncake trace line %d: timestamp %d is negative", line, row.Timestamp)
		case row.InputLength < 1 || row.InputLength > maxTraceTokens:
			return nil, fmt.Errorf("mooncake trace line %d: input_length %d out of range [1, %d]", line, row.InputLength, maxTraceTokens)
		case row.OutputLength < 1 || row.OutputLength > maxTraceTokens:
			return nil, fmt.Errorf("mooncake trace line %d: output_length %d out of range [1, %d]", line, row.OutputLength, maxTraceTokens)
		case len(row.HashIDs) > maxTraceTokens/MooncakeBlockTokens+1:
			return nil, fmt.Errorf("mooncake trace line %d: %d hash_ids is more than %d", line, len(row.HashIDs), maxTraceTokens/MooncakeBlockTokens+1)
		}
		for i, id := range row.HashIDs {
			if id < 0 {
				return nil, fmt.Errorf("mooncake trace line %d: hash_ids[%d] = %d is negative", line, i, id)
			}
		}
		if n := len(rows); n > 0 && row.Timestamp < rows[n-1].Timestamp {
			return nil, fmt.Errorf("mooncake trace line %d: timestamp %d is before the previous row's %d (rows must be in time order)", line, row.Timestamp, rows[n-1].Timestamp)
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mooncake trace line %d: %w", line+1, err)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("mooncake trace: no rows")
	}
	return rows, nil
}

// LoadMooncake reads a Mooncake JSONL trace file.
func LoadMooncake(path string) ([]MooncakeRow, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := ParseMooncake(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rows, nil
}

// MooncakeOptions shape a Mooncake replay.
type MooncakeOptions struct {
	// Format of the prompts (Chat by default).
	Format Format
	// BlockTokens is the number of tokens (words) each hash id becomes
	// (default 512, the trace's own block size). A smaller value shrinks every
	// prompt by BlockTokens/512 while keeping the trace's prefix structure, so
	// the ideal block hit share is unchanged: useful for fast tests.
	BlockTokens int
	// Seed varies the text of every block (0 is a valid seed).
	Seed uint64
	// MaxOutputTokens caps every request's output length (0: the trace's
	// own). Outputs never enter a Mooncake prompt, so a cap keeps the prefix
	// structure while shortening a replay that studies the prefix cache.
	MaxOutputTokens int
	// Priorities is the priority mix of the rows (empty: no priority),
	// drawn per row from Seed: the trace has no priorities.
	Priorities []Share
}

// Mooncake replays Mooncake rows as requests. Each hash id becomes a fixed
// pseudo-random block of BlockTokens words (seeded by the id and Seed); a
// prompt is its blocks concatenated, then cut (or padded with words unique to
// the request) to input_length tokens, so equal id prefixes give equal prompt
// prefixes. The first row's timestamp is time zero.
type Mooncake struct {
	rows []MooncakeRow
	opt  MooncakeOptions
	next int
}

// NewMooncake returns a source over rows.
func NewMooncake(rows []MooncakeRow, opt MooncakeOptions) (*Mooncake, error) {
	if opt.BlockTokens == 0 {
		opt.BlockTokens = MooncakeBlockTokens
	}
	if opt.BlockTokens < 1 || opt.BlockTokens > MooncakeBlockTokens {
		return nil, fmt.Errorf("mooncake: block tokens %d out of range [1, %d]", opt.BlockTokens, MooncakeBlockTokens)
	}
	if opt.Format != Chat && opt.Format != Completion {
		return nil, fmt.Errorf("mooncake: unknown format %d", opt.Format)
	}
	if opt.MaxOutputTokens < 0 {
		return nil, fmt.Errorf("mooncake: max output tokens %d is negative", opt.MaxOutputTokens)
	}
	if len(opt.Priorities) > 0 {
		if err := validShares(opt.Priorities); err != nil {
			return nil, fmt.Errorf("mooncake: priorities: %w", err)
		}
	}
	return &Mooncake{rows: rows, opt: opt}, nil
}

// Timed reports true: rows carry timestamps.
func (m *Mooncake) Timed() bool { return true }

// Len is the number of rows.
func (m *Mooncake) Len() int { return len(m.rows) }

// Next returns the next row as a request.
func (m *Mooncake) Next(time.Duration) (Request, bool) {
	if m.next >= len(m.rows) {
		return Request{}, false
	}
	i := m.next
	m.next++
	return m.Request(i), true
}

// scaled returns a trace token count scaled to the block size.
func (m *Mooncake) scaled(n int) int {
	if m.opt.BlockTokens == MooncakeBlockTokens {
		return n
	}
	s := (n*m.opt.BlockTokens + MooncakeBlockTokens/2) / MooncakeBlockTokens
	return max(s, 1)
}

// Request builds the request of row i.
func (m *Mooncake) Request(i int) Request {
	row := m.rows[i]
	r := Request{
		Index:     i,
		Offset:    time.Duration(row.Timestamp-m.rows[0].Timestamp) * time.Millisecond,
		MaxTokens: row.OutputLength, // outputs never enter the prefix cache: not scaled
		HashIDs:   row.HashIDs,
		Priority:  rowPriority(m.opt.Priorities, mix64(uint64(i)^mix64(m.opt.Seed^0x6d6f6f6e))),
	}
	if m.opt.MaxOutputTokens > 0 {
		r.MaxTokens = min(r.MaxTokens, m.opt.MaxOutputTokens)
	}
	singlePrompt(&r, m.opt.Format, m.scaled(row.InputLength), func(n int) string {
		return m.text(i, row.HashIDs, n)
	})
	return r
}

func (m *Mooncake) text(i int, ids []int, n int) string {
	var w words.Writer
	w.Grow(n)
	bt := m.opt.BlockTokens
	for _, id := range ids {
		if w.Len() >= n {
			break
		}
		w.Add(mix64(uint64(id)^mix64(m.opt.Seed)), min(bt, n-w.Len()))
	}
	// Pad with words unique to this row (a tail no other row shares).
	w.Add(mix64(uint64(i)^0x7061640000000000^mix64(m.opt.Seed+1)), n-w.Len())
	return w.String()
}

// PrefixIdeal is the best prefix-cache reuse an unbounded cache could give a
// sequence of Mooncake rows, sent one after another.
type PrefixIdeal struct {
	// Blocks and HitBlocks count hash-id blocks, and those whose whole
	// prefix of ids was seen in an earlier row.
	Blocks, HitBlocks int
	// PromptTokens and HitTokens count prompt tokens (as the trace states
	// them, scaled by BlockTokens/512), and those inside hit blocks.
	PromptTokens, HitTokens int
}

// BlockShare is HitBlocks/Blocks.
func (p PrefixIdeal) BlockShare() float64 { return ratio(p.HitBlocks, p.Blocks) }

// TokenShare is HitTokens/PromptTokens.
func (p PrefixIdeal) TokenShare() float64 { return ratio(p.HitTokens, p.PromptTokens) }

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// MooncakeIdeal computes the ideal prefix reuse of rows in order, with blocks
// of blockTokens tokens (0 means 512). A block is a hit when the row's ids up
// to and including it are a prefix of some earlier row's ids.
func MooncakeIdeal(rows []MooncakeRow, blockTokens int) PrefixIdeal {
	if blockTokens == 0 {
		blockTokens = MooncakeBlockTokens
	}
	m := &Mooncake{opt: MooncakeOptions{BlockTokens: blockTokens}}
	type node struct {
		parent uint64
		id     int
	}
	seen := make(map[node]uint64) // (parent prefix, id) → prefix key
	var p PrefixIdeal
	for _, row := range rows {
		n := m.scaled(row.InputLength)
		p.PromptTokens += n
		p.Blocks += len(row.HashIDs)
		var key uint64 // 0 is the empty prefix
		hit := true
		for bi, id := range row.HashIDs {
			k := node{key, id}
			next, ok := seen[k]
			if !ok {
				next = uint64(len(seen) + 1)
				seen[k] = next
				hit = false
			}
			key = next
			if hit {
				p.HitBlocks++
				p.HitTokens += max(0, min(blockTokens, n-bi*blockTokens))
			}
		}
	}
	return p
}
