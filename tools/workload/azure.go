package workload

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/inferlb/inferlb/internal/words"
)

// AzureRow is one request of an Azure LLM inference trace (Azure Public
// Dataset, "Splitwise", ISCA 2024): CSV with the header
// TIMESTAMP,ContextTokens,GeneratedTokens and timestamps like
// 2023-11-16 18:17:03.9799600.
type AzureRow struct {
	Time            time.Time
	ContextTokens   int
	GeneratedTokens int
}

// azureTimeLayout parses the trace's timestamps; Go accepts any number of
// fractional-second digits after the seconds when parsing.
const azureTimeLayout = "2006-01-02 15:04:05"

// ParseAzure reads an Azure LLM inference trace CSV. The header row must name
// the three columns (in any order; extra columns are an error). Every error
// names the line. Rows must be in non-decreasing time order.
func ParseAzure(r io.Reader) ([]AzureRow, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	line := 0
	col := map[string]int{}
	var rows []AzureRow
	for sc.Scan() {
		line++
		text := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(text) == "" {
			continue
		}
		fields := strings.Split(text, ",")
		if len(col) == 0 {
			for i, f := range fields {
				name := strings.TrimSpace(f)
				if i == 0 {
					name = strings.TrimPrefix(name, "\ufeff")
				}
				switch name {
				case "TIMESTAMP", "ContextTokens", "GeneratedTokens":
				default:
					return nil, fmt.Errorf("azure trace line %d: unexpected column %q (want TIMESTAMP,ContextTokens,GeneratedTokens)", line, name)
				}
				if _, dup := col[name]; dup {
					return nil, fmt.Errorf("azure trace line %d: column %q appears twice", line, name)
				}
				col[name] = i
			}
			if len(col) != 3 {
				return nil, fmt.Errorf("azure trace line %d: header has %d of the 3 columns TIMESTAMP,ContextTokens,GeneratedTokens", line, len(col))
			}
			continue
		}
		if len(fields) != 3 {
			return nil, fmt.Errorf("azure trace line %d: %d fields, want 3", line, len(fields))
		}
		ts := strings.TrimSpace(fields[col["TIMESTAMP"]])
		t, err := time.Parse(azureTimeLayout, ts)
		if err != nil {
			return nil, fmt.Errorf("azure trace line %d: TIMESTAMP %q: want a time like 2023-11-16 18:17:03.9799600", line, ts)
		}
		ctx, err := traceInt(fields[col["ContextTokens"]])
		if err != nil {
			return nil, fmt.Errorf("azure trace line %d: ContextTokens: %w", line, err)
		}
		gen, err := traceInt(fields[col["GeneratedTokens"]])
		if err != nil {
			return nil, fmt.Errorf("azure trace line %d: GeneratedTokens: %w", line, err)
		}
		if n := len(rows); n > 0 && t.Before(rows[n-1].Time) {
			return nil, fmt.Errorf("azure trace line %d: TIMESTAMP %s is before the previous row's (rows must be in time order)", line, ts)
		}
		rows = append(rows, AzureRow{Time: t, ContextTokens: ctx, GeneratedTokens: gen})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("azure trace line %d: %w", line+1, err)
	}
	if len(col) == 0 {
		return nil, fmt.Errorf("azure trace: empty (no header)")
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("azure trace: no rows after the header")
	}
	return rows, nil
}

func traceInt(s string) (int, error) {
	s = strings.TrimSpace(s)
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not an integer", s)
	}
	if v < 1 || v > maxTraceTokens {
		return 0, fmt.Errorf("%d out of range [1, %d]", v, maxTraceTokens)
	}
	return v, nil
}

// LoadAzure reads an Azure trace CSV file.
func LoadAzure(path string) ([]AzureRow, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := ParseAzure(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rows, nil
}

// AzureOptions shape an Azure replay.
type AzureOptions struct {
	Format Format
	// Seed varies the prompt text (and the priorities drawn).
	Seed uint64
	// Priorities is the priority mix of the rows (empty: no priority),
	// drawn per row from Seed: the trace has no priorities.
	Priorities []Share
}

// Azure replays Azure rows: arrivals at the trace's times (the first row is
// time zero), a prompt of exactly ContextTokens tokens of random words (the
// trace has no prefix information, so prompts share nothing), and
// max_tokens = GeneratedTokens.
type Azure struct {
	rows []AzureRow
	opt  AzureOptions
	next int
}

// NewAzure returns a source over rows.
func NewAzure(rows []AzureRow, opt AzureOptions) (*Azure, error) {
	if opt.Format != Chat && opt.Format != Completion {
		return nil, fmt.Errorf("azure: unknown format %d", opt.Format)
	}
	if len(opt.Priorities) > 0 {
		if err := validShares(opt.Priorities); err != nil {
			return nil, fmt.Errorf("azure: priorities: %w", err)
		}
	}
	return &Azure{rows: rows, opt: opt}, nil
}

// Timed reports true.
func (a *Azure) Timed() bool { return true }

// Len is the number of rows.
func (a *Azure) Len() int { return len(a.rows) }

// Next returns the next row as a request.
func (a *Azure) Next(time.Duration) (Request, bool) {
	if a.next >= len(a.rows) {
		return Request{}, false
	}
	i := a.next
	a.next++
	return a.Request(i), true
}

// Request builds the request of row i.
func (a *Azure) Request(i int) Request {
	row := a.rows[i]
	r := Request{
		Index:     i,
		Offset:    row.Time.Sub(a.rows[0].Time),
		MaxTokens: row.GeneratedTokens,
	}
	seed := mix64(uint64(i) ^ mix64(a.opt.Seed^0x617a757265))
	r.Priority = rowPriority(a.opt.Priorities, seed)
	singlePrompt(&r, a.opt.Format, row.ContextTokens, func(n int) string { return words.Words(seed, n) })
	return r
}

// rowPriority draws a trace row's priority from its seed (the same row and
// seed always get the same priority).
func rowPriority(sh []Share, seed uint64) string {
	if len(sh) == 0 {
		return ""
	}
	return pickAt(sh, float64(mix64(seed^0x7072696f)>>11)/(1<<53))
}
