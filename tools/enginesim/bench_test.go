package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The benchmark runs the simulator in a child process (this test binary,
// re-executed with benchChildEnv set) so that its CPU use is measured apart
// from the clients'.
const benchChildEnv = "INFERLB_ENGINESIM_BENCH_CHILD"

const (
	benchEngines = 12
	benchStreams = 1000
	benchTokens  = 60 // per stream: about 3 s at 20 tokens/s
	// benchScale makes the H100 profile's step at ~83 running sequences
	// (6.5 + 0.055·83 ≈ 11.1 ms simulated) last ~47 ms; with the longer
	// steps that carry the ramp's prefills, a stream's median rate is
	// ~20 tokens/s.
	benchScale = 4.2
	// benchRamp spreads the streams' starts.
	benchRamp = time.Second
)

func TestMain(m *testing.M) {
	if os.Getenv(benchChildEnv) == "1" {
		os.Exit(benchChild())
	}
	os.Exit(m.Run())
}

// benchChild serves benchEngines engines, prints their URLs and READY, and
// when stdin closes prints the first-token timing errors as JSON.
func benchChild() int {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var servers []*Server
	for i := range benchEngines {
		s, err := Start(ctx, Options{ID: fmt.Sprintf("e%d", i), Model: "m", Profile: H100Llama8B, TimeScale: benchScale, Logger: log})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		servers = append(servers, s)
		fmt.Println(s.URL())
	}
	if path := os.Getenv("INFERLB_ENGINESIM_BENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer f.Close()
			defer pprof.StopCPUProfile()
		}
	}
	fmt.Println("READY")
	_, _ = io.Copy(io.Discard, os.Stdin)
	var eng, flush []float64
	for _, s := range servers {
		l := s.TimingLags()
		for _, d := range l.Engine {
			eng = append(eng, float64(d)/float64(time.Millisecond))
		}
		for _, d := range l.Flush {
			flush = append(flush, float64(d)/float64(time.Millisecond))
		}
		s.Close()
	}
	q := func(xs []float64, p float64) float64 {
		if len(xs) == 0 {
			return -1
		}
		slices.Sort(xs)
		return xs[min(len(xs)-1, int(p*float64(len(xs))))]
	}
	_ = json.NewEncoder(os.Stdout).Encode(map[string]float64{
		"n":          float64(len(flush)),
		"engine_p50": q(eng, 0.5), "engine_p99": q(eng, 0.99), "engine_max": q(eng, 1),
		"flush_p50": q(flush, 0.5), "flush_p99": q(flush, 0.99), "flush_max": q(flush, 1),
	})
	return 0
}

// cpuTicks is the process's user+system CPU time from /proc.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which ends with ')'.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clkTck, nil
}

// selfCPU is this (client) process's user+system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runqWait sums the time the process's threads spent runnable but waiting
// for a CPU (/proc/PID/task/*/schedstat, second field): how much other
// processes starved the simulator.
func runqWait(pid int) time.Duration {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum time.Duration
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) >= 2 {
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			sum += time.Duration(ns)
		}
	}
	return sum
}

// BenchmarkFleet12Engines1000Streams: one process serving 12 engines with
// 1,000 concurrent streams at ~20 tokens/s each. Reports the simulator
// process's CPU (cores) and its timing error: for each stream, when the
// first token was flushed minus when the model intended it.
func BenchmarkFleet12Engines1000Streams(b *testing.B) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		b.Skip("needs /proc to measure the simulator's CPU")
	}
	for b.Loop() {
		runFleetBench(b)
	}
}

func runFleetBench(b *testing.B) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), benchChildEnv+"=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	sc := bufio.NewScanner(stdout)
	var urls []string
	for sc.Scan() && sc.Text() != "READY" {
		urls = append(urls, sc.Text())
	}
	if len(urls) != benchEngines {
		b.Fatalf("child started %d engines", len(urls))
	}
	tr := &http.Transport{MaxIdleConnsPerHost: benchStreams, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Minute}

	cpu0, err := cpuTime(cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	wait0 := runqWait(cmd.Process.Pid)
	self0 := selfCPU()
	t0 := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var rates []float64
	var failed int
	for i := range benchStreams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Arrivals spread over benchRamp, as streams of a real fleet.
			time.Sleep(time.Until(t0.Add(benchRamp * time.Duration(i) / benchStreams)))
			body := chatBody("m", "bench", text(fmt.Sprintf("s%d", i), 40), benchTokens, true)
			resp, err := client.Post(urls[i%benchEngines]+"/v1/chat/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				mu.Lock()
				failed++
				mu.Unlock()
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			n := 0
			var first, last time.Time
			for {
				line, err := br.ReadSlice('\n')
				if err != nil {
					break
				}
				if bytes.Contains(line, []byte(`"delta":{"content":"`)) {
					now := time.Now()
					if n == 0 {
						first = now
					}
					last = now
					n++
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if n != benchTokens {
				failed++
				return
			}
			rates = append(rates, float64(n-1)/last.Sub(first).Seconds())
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	wait1 := runqWait(cmd.Process.Pid)
	self1 := selfCPU()
	cpu1, err := cpuTime(cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	stdin.Close()
	var lag map[string]float64
	out, _ := io.ReadAll(stdout)
	if err := json.Unmarshal(out, &lag); err != nil {
		b.Fatalf("child output %q: %v", out, err)
	}
	if failed > 0 {
		b.Fatalf("%d of %d streams failed", failed, benchStreams)
	}
	slices.Sort(rates)
	b.ReportMetric((cpu1-cpu0).Seconds()/wall.Seconds(), "sim-cpu-cores")
	b.ReportMetric((wait1-wait0).Seconds()/wall.Seconds(), "sim-runq-wait-cores")
	b.ReportMetric((self1-self0).Seconds()/wall.Seconds(), "client-cpu-cores")
	b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(benchStreams*benchTokens), "sim-cpu-us/token")
	b.ReportMetric(lag["engine_p50"], "ttft-err-engine-p50-ms")
	b.ReportMetric(lag["engine_p99"], "ttft-err-engine-p99-ms")
	b.ReportMetric(lag["flush_p50"], "ttft-err-flush-p50-ms")
	b.ReportMetric(lag["flush_p99"], "ttft-err-flush-p99-ms")
	b.ReportMetric(lag["flush_max"], "ttft-err-flush-max-ms")
	b.ReportMetric(rates[len(rates)/2], "stream-tok/s-p50")
	b.ReportMetric(float64(benchStreams*benchTokens)/wall.Seconds(), "tok/s")
	b.ReportMetric(wall.Seconds(), "wall-s")
}
