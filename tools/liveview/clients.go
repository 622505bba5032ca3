package liveview

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"sort"

	"github.com/inferlb/inferlb/tools/loadgen"
)

// ClientLog reads the load generator's per-request log (loadgen
// --requests-out, one JSON record per finished request) as it grows: what
// the clients saw, which no server can tell (429s as received, client TTFT).
// It is not safe for concurrent use.
type ClientLog struct {
	Path    string
	off     int64
	partial []byte // a last line not yet complete
}

// Read returns the records appended since the last call. A missing file is
// no records yet; a malformed line is skipped (a torn write is completed by
// the next call, since only complete lines are parsed).
func (c *ClientLog) Read() ([]loadgen.RequestRecord, error) {
	f, err := os.Open(c.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(c.off, io.SeekStart); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		return nil, err
	}
	c.off += int64(len(b))
	b = append(c.partial, b...)
	var out []loadgen.RequestRecord
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		var r loadgen.RequestRecord
		if json.Unmarshal(b[:i], &r) == nil {
			out = append(out, r)
		}
		b = b[i+1:]
	}
	c.partial = append([]byte(nil), b...)
	return out, nil
}

// ClientStats is what the clients of one frontend saw in an interval. Times
// are in the engines' time (the load generator runs at their time scale).
type ClientStats struct {
	Finished int
	OK       int
	// Rejected counts 429s (shed by ext_proc) by priority name.
	Rejected map[string]int
	// Failed counts errors and timeouts.
	Failed int
	// TTFT p50 and p90 of the successful requests, ms (NaN without any).
	TTFTP50, TTFTP90 float64
}

// SummarizeClients groups records by frontend (through the region each
// record came from: regionFrontend maps a region to its frontend's name).
func SummarizeClients(recs []loadgen.RequestRecord, regionFrontend map[string]string) map[string]ClientStats {
	ttft := map[string][]float64{}
	out := map[string]ClientStats{}
	for _, r := range recs {
		fe := regionFrontend[r.Region]
		if fe == "" {
			fe = r.Region
		}
		s := out[fe]
		if s.Rejected == nil {
			s.Rejected = map[string]int{}
		}
		switch r.Outcome {
		case "cancelled":
			continue
		case "ok":
			s.OK++
			if r.TTFTMs > 0 {
				ttft[fe] = append(ttft[fe], r.TTFTMs)
			}
		case "rejected":
			s.Rejected[r.Priority]++
		default:
			s.Failed++
		}
		s.Finished++
		out[fe] = s
	}
	for fe, s := range out {
		s.TTFTP50, s.TTFTP90 = quantile(ttft[fe], 0.5), quantile(ttft[fe], 0.9)
		out[fe] = s
	}
	return out
}

// quantile is the nearest-rank quantile of xs (NaN for none); xs is sorted
// in place.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return nan
	}
	sort.Float64s(xs)
	k := int(q*float64(len(xs))+0.5) - 1
	return xs[min(max(k, 0), len(xs)-1)]
}
