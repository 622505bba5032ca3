package envoylb

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/internal/envoytest"
)

// upstreams are plain HTTP servers on ephemeral ports that answer with their
// index, fail with 503 when asked to (x-fail names the failing index), and
// hold requests with x-hold until released.
type upstreams struct {
	srvs  []*http.Server
	addrs []string
	mu    sync.Mutex
	got   map[string]int // x-seq → index that received it
	hold  chan struct{}
	wg    sync.WaitGroup
}

func startUpstreams(t *testing.T, n int) *upstreams {
	u := &upstreams{got: map[string]int{}, hold: make(chan struct{})}
	for i := 0; i < n; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		idx := i
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("x-fail") == strconv.Itoa(idx) {
				w.WriteHeader(503)
				return
			}
			if seq := r.Header.Get("x-seq"); seq != "" {
				u.mu.Lock()
				u.got[seq] = idx
				u.mu.Unlock()
			}
			if r.Header.Get("x-hold") != "" {
				<-u.hold
			}
			fmt.Fprint(w, idx)
		}), ReadHeaderTimeout: 5 * time.Second}
		u.srvs = append(u.srvs, srv)
		u.addrs = append(u.addrs, ln.Addr().String())
		u.wg.Add(1)
		go func() { defer u.wg.Done(); _ = srv.Serve(ln) }()
	}
	return u
}

func (u *upstreams) close() {
	for _, s := range u.srvs {
		_ = s.Close()
	}
	u.wg.Wait()
}

func (u *upstreams) received(seq string) (int, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	i, ok := u.got[seq]
	return i, ok
}

const bootstrapTmpl = `
static_resources:
  listeners:
  - name: l
    address: {socket_address: {address: 127.0.0.1, port_value: %d}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: t
          route_config:
            virtual_hosts:
            - name: v
              domains: ["*"]
              routes:
              - match: {prefix: "/", headers: [{name: x-lb, string_match: {exact: ring}}]}
                route: {cluster: ring, hash_policy: [{header: {header_name: x-key}}]}
              - match: {prefix: "/"}
                route:
                  cluster: maglev
                  hash_policy: [{header: {header_name: x-key}}]
                  retry_policy:
                    retry_on: 5xx
                    num_retries: 1
                    retry_host_predicate:
                    - name: envoy.retry_host_predicates.previous_hosts
                      typed_config: {"@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate}
                    host_selection_retry_max_attempts: 5
                    retry_back_off: {base_interval: 0.001s, max_interval: 0.002s}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: maglev
    type: STATIC
    lb_policy: MAGLEV
    maglev_lb_config: {table_size: 65537}
    common_lb_config:
      healthy_panic_threshold: {value: 0}
      consistent_hashing_lb_config: {hash_balance_factor: 150}
    load_assignment: {cluster_name: maglev, endpoints: [{lb_endpoints: [%s]}]}
  - name: ring
    type: STATIC
    lb_policy: RING_HASH
    ring_hash_lb_config: {minimum_ring_size: 1024, maximum_ring_size: 8388608}
    common_lb_config:
      healthy_panic_threshold: {value: 0}
    load_assignment: {cluster_name: ring, endpoints: [{lb_endpoints: [%s]}]}
`

// TestAgainstEnvoy sends requests through a real Envoy 1.40 to upstreams
// with unequal weights and checks that the model picks the same upstream
// for every key: Maglev and ring hash (1500 keys each), a retry with
// previous_hosts after the first pick fails (the first 300 keys), and
// bounded loads (hash_balance_factor 150) for one key held open 12 times.
// Tolerance: at most 0.5% of keys may disagree (none did when written); the
// per-upstream shares then agree within 0.5 points.
func TestAgainstEnvoy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Envoy")
	}
	defer leaktest.AfterTest(t)()
	weights := []uint32{100, 250, 400, 150, 600, 300}
	u := startUpstreams(t, len(weights))
	defer u.close()
	var eps []string
	hosts := make([]Host, len(weights))
	for i, a := range u.addrs {
		host, port, _ := net.SplitHostPort(a)
		eps = append(eps, fmt.Sprintf("{endpoint: {address: {socket_address: {address: %s, port_value: %s}}}, load_balancing_weight: %d}", host, port, weights[i]))
		hosts[i] = Host{Key: a, Weight: weights[i], Healthy: true}
	}
	port := envoytest.FreePort(t)
	list := strings.Join(eps, ", ")
	e := envoytest.Start(t, envoytest.Options{Bootstrap: fmt.Sprintf(bootstrapTmpl, port, list, list)})
	defer e.Stop()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	defer client.CloseIdleConnections()
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	get := func(hdr map[string]string) (int, error) {
		req, _ := http.NewRequest("GET", url, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			return -1, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return -1, fmt.Errorf("status %d", resp.StatusCode)
		}
		return strconv.Atoi(string(b))
	}
	// Envoy must reach the upstreams before the comparison starts.
	ctx := context.Background()
	if err := envoytest.Poll(ctx, 20*time.Second, 20*time.Millisecond, func() error {
		_, err := get(map[string]string{"x-key": "warm"})
		return err
	}); err != nil {
		t.Fatal(err)
	}

	maglev, err := New(Config{Policy: Maglev, HashBalanceFactor: 150}, hosts)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := New(Config{Policy: RingHash}, hosts)
	if err != nil {
		t.Fatal(err)
	}
	const keys = 1500
	idle := &loadMap{active: make([]int, len(hosts))}
	for _, c := range []struct {
		name string
		lb   *LB
		hdr  map[string]string
	}{{"maglev", maglev, nil}, {"ring_hash", ring, map[string]string{"x-lb": "ring"}}} {
		diff := 0
		envoyShare, modelShare := make([]float64, len(hosts)), make([]float64, len(hosts))
		for i := 0; i < keys; i++ {
			key := fmt.Sprintf("conv-%d-%x", i, i*7919)
			h := map[string]string{"x-key": key}
			for k, v := range c.hdr {
				h[k] = v
			}
			got, err := get(h)
			if err != nil {
				t.Fatalf("%s key %s: %v", c.name, key, err)
			}
			want := c.lb.Choose(HeaderHash(key), idle, nil, 0)
			if got != want {
				diff++
			}
			envoyShare[got] += 1.0 / keys
			modelShare[want] += 1.0 / keys
		}
		if float64(diff) > 0.005*keys {
			t.Errorf("%s: %d of %d keys went elsewhere than the model says", c.name, diff, keys)
		}
		for i := range hosts {
			if d := envoyShare[i] - modelShare[i]; d > 0.005 || d < -0.005 {
				t.Errorf("%s: upstream %d share %.4f in Envoy, %.4f in the model", c.name, i, envoyShare[i], modelShare[i])
			}
		}
		t.Logf("%s: %d/%d keys differ; Envoy shares %.3f", c.name, diff, keys, envoyShare)
	}

	// Retries: the first pick fails with 503, Envoy retries on another
	// host chosen with previous_hosts.
	diff := 0
	for i := 0; i < 300; i++ {
		key := fmt.Sprintf("conv-%d-%x", i, i*7919)
		first := maglev.Choose(HeaderHash(key), idle, nil, 0)
		got, err := get(map[string]string{"x-key": key, "x-fail": strconv.Itoa(first)})
		if err != nil {
			// All six re-selections landed on the failing host.
			got = first
		}
		want := maglev.Choose(HeaderHash(key), idle, func(x int) bool { return x == first }, 5)
		if got != want {
			diff++
		}
	}
	if diff > 2 {
		t.Errorf("retries: %d of 300 went elsewhere than the model says", diff)
	}

	// Bounded loads: one key, requests held open one after another; each
	// must land where the model, fed the same in-flight counts, sends it.
	l := &loadMap{active: make([]int, len(hosts))}
	var held sync.WaitGroup
	var seqDiff []string
	for i := 0; i < 12; i++ {
		seq := strconv.Itoa(i)
		held.Add(1)
		go func() {
			defer held.Done()
			_, _ = get(map[string]string{"x-key": "hot", "x-hold": "1", "x-seq": seq})
		}()
		var got int
		if err := envoytest.Poll(ctx, 10*time.Second, 2*time.Millisecond, func() error {
			var ok bool
			if got, ok = u.received(seq); !ok {
				return fmt.Errorf("request %s not received yet", seq)
			}
			return nil
		}); err != nil {
			close(u.hold)
			held.Wait()
			t.Fatal(err)
		}
		want := maglev.Choose(HeaderHash("hot"), l, nil, 0)
		if got != want {
			seqDiff = append(seqDiff, fmt.Sprintf("#%d envoy %d model %d", i, got, want))
		}
		l.active[got]++
		l.total++
	}
	close(u.hold)
	held.Wait()
	if len(seqDiff) > 0 {
		t.Errorf("bounded loads: %v (in flight %v)", seqDiff, l.active)
	}
	used := 0
	for _, a := range l.active {
		if a > 0 {
			used++
		}
	}
	if used < 2 {
		t.Errorf("bounded loads: the hot key stayed on one host: %v", l.active)
	}
}
