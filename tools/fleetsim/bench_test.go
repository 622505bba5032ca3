package fleetsim

import (
	"context"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user + system CPU seconds: on a shared machine
// the wall clock measures the neighbours too.
func cpuTime() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// BenchmarkScale runs the scale scenario (SIM_ENGINES engines, default
// 1000; SIM_REQUESTS requests, default 1,000,000; SIM_POLICY, default
// inferlb) once per iteration and reports requests per wall second.
//
//	SIM_REQUESTS=1000000 go test -run '^$' -bench Scale -benchtime 1x ./tools/fleetsim
func BenchmarkScale(b *testing.B) {
	engines, requests := envInt("SIM_ENGINES", 1000), envInt("SIM_REQUESTS", 1_000_000)
	pol := os.Getenv("SIM_POLICY")
	if pol == "" {
		pol = PolicyInferlb
	}
	sc, err := ScaleScenario(engines, requests)
	if err != nil {
		b.Fatal(err)
	}
	defer WithSimGC()()
	for b.Loop() {
		t0, c0 := time.Now(), cpuTime()
		r, err := Run(context.Background(), Options{Scenario: sc, Policy: pol, MaxArrivals: requests, NoSeries: true})
		if err != nil {
			b.Fatal(err)
		}
		el, cpu := time.Since(t0).Seconds(), cpuTime()-c0
		b.ReportMetric(float64(r.Arrived)/cpu, "req/cpu-s")
		b.ReportMetric(float64(r.Arrived), "requests")
		b.ReportMetric(el, "wall-s")
		b.ReportMetric(cpu, "cpu-s")
	}
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}
