// Package liveview is the demo's live view: it polls every engine's /metrics
// (in its server's names, as the control plane reads them) and every frontend Envoy's admin /clusters, and renders one
// terminal screen that shows, per engine, its load and latency, and per
// frontend, the weight Envoy holds for it and the share of traffic it got.
//
// It reads only what an operator could read: the engines' Prometheus
// endpoints and Envoy's admin interface, so what it shows is what Envoy
// actually applied, not what the control plane meant to send.
package liveview

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane/signals"
)

// EngineSample is one scrape of an engine's /metrics. Counters are totals
// since the engine started; rates come from the difference of two samples.
type EngineSample struct {
	Up              bool
	Running         float64
	Waiting         float64
	KVUsage         float64 // 0..1
	TTFTSum         float64 // seconds
	TTFTCount       float64
	PrefixHits      float64
	PrefixQueries   float64
	GenerationToks  float64
	RequestsSuccess float64
}

// HostSample is what one frontend Envoy holds for one engine in one cluster.
type HostSample struct {
	Cluster  string
	Weight   uint32
	Priority uint32
	Healthy  bool
	RqTotal  float64
	RqError  float64
}

// FrontendSample is one poll of a frontend Envoy's /clusters and /stats.
type FrontendSample struct {
	Up    bool
	Hosts map[string][]HostSample // by "ip:port"
	// Retries counts Envoy's retries (upstream_rq_retry) per cluster.
	Retries map[string]float64
}

// Sample is everything read in one poll.
type Sample struct {
	At        time.Time
	Engines   map[string]EngineSample   // by engine id
	Frontends map[string]FrontendSample // by frontend name
}

// Collector polls a fleet's engines and frontend Envoys.
type Collector struct {
	Fleet *fleet.Spec
	// EnvoyAdmin maps frontend name → Envoy admin base URL.
	EnvoyAdmin map[string]string
	// EngineURL maps engine id → base URL; defaults to http://<address>.
	EngineURL map[string]string
	Client    *http.Client
}

// Collect reads every engine and Envoy concurrently. Unreachable ones are
// marked not Up; Collect itself fails only when ctx ends.
func (c *Collector) Collect(ctx context.Context) (Sample, error) {
	s := Sample{At: time.Now(), Engines: map[string]EngineSample{}, Frontends: map[string]FrontendSample{}}
	client := c.Client
	if client == nil {
		client = &http.Client{Timeout: 2 * time.Second}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, e := range c.Fleet.Engines {
		url := "http://" + e.Address
		if u, ok := c.EngineURL[e.ID]; ok {
			url = u
		}
		wg.Add(1)
		go func(id, url, server string) {
			defer wg.Done()
			es, err := scrapeEngine(ctx, client, url+"/metrics", server)
			es.Up = err == nil
			mu.Lock()
			s.Engines[id] = es
			mu.Unlock()
		}(e.ID, url, e.Server)
	}
	for name, admin := range c.EnvoyAdmin {
		wg.Add(1)
		go func(name, admin string) {
			defer wg.Done()
			fs, err := scrapeEnvoy(ctx, client, admin+"/clusters?format=json")
			fs.Up = err == nil
			if err == nil {
				if b, err := get(ctx, client, admin+"/stats?filter="+retryStatFilter); err == nil {
					fs.Retries = ParseEnvoyRetries(b)
				}
			}
			mu.Lock()
			s.Frontends[name] = fs
			mu.Unlock()
		}(name, admin)
	}
	wg.Wait()
	return s, ctx.Err()
}

func get(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, nil
}

func scrapeEngine(ctx context.Context, client *http.Client, url, server string) (EngineSample, error) {
	b, err := get(ctx, client, url)
	if err != nil {
		return EngineSample{}, err
	}
	return ParseEngineMetrics(server, b)
}

// ParseEngineMetrics reads an engine's metrics from Prometheus text format
// in the names of its server kind (the fleet's engines[].server: vllm,
// sglang, generic; "" is vLLM), with the control plane's mapping and parser
// (signals.MappingFor(server).Parse: values of every label set summed; for
// vLLM and SGLang the running, waiting and KV-usage gauges required). A
// counter the engine does not export reads as 0 here.
func ParseEngineMetrics(server string, text []byte) (EngineSample, error) {
	mp := signals.MappingFor(server)
	if mp == nil {
		return EngineSample{}, fmt.Errorf("server kind %q has no metric names (vllm, sglang or generic)", server)
	}
	m, err := mp.Parse(bytes.NewReader(text))
	if err != nil {
		return EngineSample{}, err
	}
	z := func(v float64) float64 {
		if math.IsNaN(v) {
			return 0
		}
		return v
	}
	return EngineSample{
		Running: m.Running, Waiting: m.Waiting, KVUsage: m.KVUsage,
		TTFTSum: z(m.TTFTSum), TTFTCount: z(m.TTFTCount),
		PrefixHits: z(m.PrefixHits), PrefixQueries: z(m.PrefixQueries),
		GenerationToks: z(m.GenTokens), RequestsSuccess: z(m.Success),
	}, nil
}

// envoyClusters is the part of Envoy's /clusters?format=json we read.
type envoyClusters struct {
	ClusterStatuses []struct {
		Name         string `json:"name"`
		HostStatuses []struct {
			Address struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue uint32 `json:"port_value"`
				} `json:"socket_address"`
			} `json:"address"`
			Stats []struct {
				Name  string `json:"name"`
				Value string `json:"value"`
			} `json:"stats"`
			HealthStatus struct {
				EdsHealthStatus           string `json:"eds_health_status"`
				FailedActiveHealthCheck   bool   `json:"failed_active_health_check"`
				FailedOutlierCheck        bool   `json:"failed_outlier_check"`
				PendingDynamicRemoval     bool   `json:"pending_dynamic_removal"`
				FailedActiveDegradedCheck bool   `json:"failed_active_degraded_check"`
			} `json:"health_status"`
			Weight   uint32 `json:"weight"`
			Priority uint32 `json:"priority"`
		} `json:"host_statuses"`
	} `json:"cluster_statuses"`
}

func scrapeEnvoy(ctx context.Context, client *http.Client, url string) (FrontendSample, error) {
	b, err := get(ctx, client, url)
	if err != nil {
		return FrontendSample{}, err
	}
	return ParseEnvoyClusters(b)
}

// ParseEnvoyClusters reads hosts, weights, health and request counters from
// Envoy's /clusters?format=json. Envoy writes 64-bit counters as strings.
func ParseEnvoyClusters(b []byte) (FrontendSample, error) {
	var ec envoyClusters
	if err := json.Unmarshal(b, &ec); err != nil {
		return FrontendSample{}, fmt.Errorf("parse envoy clusters: %w", err)
	}
	fs := FrontendSample{Hosts: map[string][]HostSample{}}
	for _, c := range ec.ClusterStatuses {
		for _, h := range c.HostStatuses {
			addr := h.Address.SocketAddress.Address + ":" + strconv.Itoa(int(h.Address.SocketAddress.PortValue))
			hs := HostSample{Cluster: c.Name, Weight: h.Weight, Priority: h.Priority}
			st := h.HealthStatus
			hs.Healthy = !st.FailedActiveHealthCheck && !st.FailedOutlierCheck &&
				(st.EdsHealthStatus == "" || st.EdsHealthStatus == "HEALTHY")
			for _, s := range h.Stats {
				v, _ := strconv.ParseFloat(s.Value, 64)
				switch s.Name {
				case "rq_total":
					hs.RqTotal = v
				case "rq_error":
					hs.RqError = v
				}
			}
			fs.Hosts[addr] = append(fs.Hosts[addr], hs)
		}
	}
	return fs, nil
}

// retryStatFilter selects the per-cluster retry counters of Envoy's
// /stats (a regular expression, URL-encoded).
const retryStatFilter = `%5Ecluster%5C..*%5C.upstream_rq_retry%24`

// ParseEnvoyRetries reads "cluster.NAME.upstream_rq_retry: N" lines of
// Envoy's plain /stats into N per cluster NAME.
func ParseEnvoyRetries(b []byte) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, val, ok := strings.Cut(line, ": ")
		if !ok || !strings.HasPrefix(name, "cluster.") || !strings.HasSuffix(name, ".upstream_rq_retry") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		out[strings.TrimSuffix(strings.TrimPrefix(name, "cluster."), ".upstream_rq_retry")] = v
	}
	return out
}

// rate is (b−a)/dt, or NaN when there is no earlier sample or a counter
// went backwards (a restarted process).
func rate(a, b float64, dt time.Duration) float64 {
	if dt <= 0 || b < a {
		return math.NaN()
	}
	return (b - a) / dt.Seconds()
}
