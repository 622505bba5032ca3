package rivalbench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Router is one router under test: inferlb, or a rival router binary
// running one of its policies at that router's defaults.
type Router struct {
	// ID names the router in tables, flags and files, e.g.
	// "smg-cache_aware".
	ID string
	// Binary is "inferlb", or the rival's program: "smg", "sglang-router"
	// or "vllm-router".
	Binary string
	// Policy is the rival's --policy ("" for inferlb).
	Policy string
}

// The routers the bench knows. Round robin is vllm-router's round_robin
// policy: a real router that ignores the prompt, the baseline of every
// ratio.
var (
	Inferlb                  = Router{ID: "inferlb", Binary: "inferlb"}
	SmgCacheAware            = Router{ID: "smg-cache_aware", Binary: "smg", Policy: "cache_aware"}
	SmgPrefixHash            = Router{ID: "smg-prefix_hash", Binary: "smg", Policy: "prefix_hash"}
	SglangRouterCacheAware   = Router{ID: "sglang-router-cache_aware", Binary: "sglang-router", Policy: "cache_aware"}
	VllmRouterCacheAware     = Router{ID: "vllm-router-cache_aware", Binary: "vllm-router", Policy: "cache_aware"}
	VllmRouterConsistentHash = Router{ID: "vllm-router-consistent_hash", Binary: "vllm-router", Policy: "consistent_hash"}
	RoundRobin               = Router{ID: "round-robin", Binary: "vllm-router", Policy: "round_robin"}
)

// AllRouters are the routers of a full run, in table order.
var AllRouters = []Router{Inferlb, SmgCacheAware, SmgPrefixHash, SglangRouterCacheAware,
	VllmRouterCacheAware, VllmRouterConsistentHash, RoundRobin}

// ParseRouters reads a comma-separated list of router ids ("all": every
// router).
func ParseRouters(s string) ([]Router, error) {
	if strings.TrimSpace(s) == "all" {
		return AllRouters, nil
	}
	var out []Router
	seen := map[string]bool{}
	for _, id := range strings.Split(s, ",") {
		id = strings.TrimSpace(id)
		if id == "" {
			continue
		}
		var r *Router
		for i := range AllRouters {
			if AllRouters[i].ID == id {
				r = &AllRouters[i]
			}
		}
		if r == nil {
			return nil, fmt.Errorf("unknown router %q (want all, or some of %s)", id, strings.Join(RouterIDs(), ", "))
		}
		if seen[id] {
			return nil, fmt.Errorf("router %q is listed twice", id)
		}
		seen[id] = true
		out = append(out, *r)
	}
	if len(out) == 0 {
		return nil, errors.New("no router to run")
	}
	return out, nil
}

// RouterIDs lists the known routers' ids.
func RouterIDs() []string {
	var ids []string
	for _, r := range AllRouters {
		ids = append(ids, r.ID)
	}
	return ids
}

// Rival versions: what scripts/setup-rivals.sh installs, each into a
// virtual environment of its own (sglang-router installs a program named
// smg as well, so the two SGLang packages must not share one).
var rivalPackages = map[string]string{
	"smg":           "smg==1.13.0",
	"sglang-router": "sglang-router==0.3.2",
	"vllm-router":   "vllm-router==0.1.17",
}

// RivalDir is where the rivals' virtual environments live:
// $INFERLB_RIVALS, else VENV/rivals.
func RivalDir(venv string) string {
	if d := os.Getenv("INFERLB_RIVALS"); d != "" {
		return d
	}
	return filepath.Join(venv, "rivals")
}

// program is the rival's executable in its own virtual environment.
func (r Router) program(rivalDir string) (string, error) {
	if r.Binary == "inferlb" {
		return "", errors.New("inferlb is not a rival")
	}
	p := filepath.Join(rivalDir, r.Binary, "bin", r.Binary)
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s is not installed at %s (run scripts/setup-rivals.sh, or make bench-rivals; it pip-installs %s)", r.Binary, p, rivalPackages[r.Binary])
	}
	return p, nil
}

// args is the rival's command line: listening on 127.0.0.1:port, its
// Prometheus exporter on 127.0.0.1:metricsPort, in front of workers, with
// its policy and every other setting at the router's defaults.
func (r Router) args(port, metricsPort int, workers []string) []string {
	var a []string
	if r.Binary == "smg" || r.Binary == "sglang-router" {
		a = append(a, "launch")
	}
	a = append(a, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--policy", r.Policy,
		"--prometheus-host", "127.0.0.1", "--prometheus-port", strconv.Itoa(metricsPort),
		"--worker-urls")
	return append(a, workers...)
}
