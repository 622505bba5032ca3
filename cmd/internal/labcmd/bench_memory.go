package labcmd

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// The protocol benchmark's memory figures. The Go heap and allocation
// figures come from the child's /metrics (its Go collector), the resident
// set from /proc, so the same command measures any build of the service
// (--extproc-binary) side by side.

// procStatusKB returns a "VmXxx:" field of /proc/pid/status in KiB.
func procStatusKB(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status %s: %w", pid, field, err)
			}
			return kb, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

// resetPeakRSS starts the process's peak resident set (VmHWM) over from
// its current resident set, so that each cell reports its own peak.
func resetPeakRSS(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// goMemory is what the child's Go collector says about its memory.
type goMemory struct {
	heapInuse, allocTotal float64
}

// scrapeGoMemory reads the child's heap in use and bytes allocated so far
// from its /metrics.
func scrapeGoMemory(ctx context.Context, httpAddr string) (goMemory, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	if err != nil {
		return goMemory{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return goMemory{}, err
	}
	defer resp.Body.Close()
	var m goMemory
	seen := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		var dst *float64
		switch name {
		case "go_memstats_heap_inuse_bytes":
			dst = &m.heapInuse
		case "go_memstats_alloc_bytes_total":
			dst = &m.allocTotal
		default:
			continue
		}
		if *dst, err = strconv.ParseFloat(val, 64); err != nil {
			return goMemory{}, fmt.Errorf("/metrics %s: %w", name, err)
		}
		seen++
	}
	if err := sc.Err(); err != nil {
		return goMemory{}, err
	}
	if seen != 2 {
		return goMemory{}, fmt.Errorf("/metrics of %s: no go_memstats_heap_inuse_bytes or go_memstats_alloc_bytes_total", httpAddr)
	}
	return m, nil
}

// cellMemory is one cell's memory figures.
type cellMemory struct {
	peakRSS, afterRSS, heap int64 // bytes
	allocPerDecision        float64
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }
