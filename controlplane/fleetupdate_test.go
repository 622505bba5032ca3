package controlplane

import (
	"strings"
	"testing"

	"github.com/inferlb/inferlb/api/fleet"
)

// A fleet update (Kubernetes discovery) swaps the engines the runner plans
// for, scrapes and bounds reports by, keeps the published weights and
// penalties of the engines that stay, and is refused when it changes the
// frontends, classes or priorities.
func TestUpdateFleetSwapsEngines(t *testing.T) {
	two, err := fleet.Load("../examples/fleet-minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultRunConfig()
	cfg.Fleet = two
	r, err := NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	node := two.Frontends[0].NodeID
	class := two.Classes[0].Name
	if _, err := r.ctrl.Seed(map[string]map[string]map[string]float64{node: {class: {"engine-1": 0.5, "engine-2": 0.5}}}, 7); err != nil {
		t.Fatal(err)
	}
	r.ctrl.penalties["engine-1"] = 0.3
	before := r.ctrl.IntakeOptions().MaxRequestsPerS[node]

	s := *two
	s.Engines = []fleet.Engine{two.Engines[0],
		{ID: "engine-3", Address: "127.0.0.1:18103", Region: "local", GPU: "H100", Model: "llama-3.1-8b"},
		{ID: "engine-4", Address: "127.0.0.1:18104", Region: "local", GPU: "H100", Model: "llama-3.1-8b"}}
	three, err := fleet.New(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.UpdateFleet(three); err != nil {
		t.Fatal(err)
	}
	if r.Fleet() != two {
		t.Error("the fleet changed before a cycle applied it")
	}
	r.applyFleet()
	if r.Fleet() != three {
		t.Fatal("applyFleet did not switch to the new fleet")
	}
	var ids []string
	for _, tg := range r.targets {
		ids = append(ids, tg.ID)
	}
	if got := strings.Join(ids, ","); got != "engine-1,engine-3,engine-4" {
		t.Errorf("scrape targets %s, want engine-1,engine-3,engine-4", got)
	}
	if got := len(r.tracker.Engines(r.cfg.Now())); got != 3 {
		t.Errorf("tracker has %d engines, want 3", got)
	}
	pub := r.ctrl.Published()[node][class]
	if _, ok := pub["engine-2"]; ok || pub["engine-1"] != 0.5 {
		t.Errorf("published after the update %v: want engine-1's 0.5 kept, engine-2 gone", pub)
	}
	if r.ctrl.Version() != 7 {
		t.Errorf("version %d after the update, want 7 kept (the next publication follows it)", r.ctrl.Version())
	}
	if r.ctrl.penalties["engine-1"] != 0.3 {
		t.Errorf("engine-1's penalty %v after the update, want 0.3 kept", r.ctrl.penalties["engine-1"])
	}
	if after := r.ctrl.IntakeOptions().MaxRequestsPerS[node]; !(after > before) {
		t.Errorf("the frontend's report bound stayed %v with one more engine (was %v): it follows the fleet's capacity", after, before)
	}

	// Another frontend: refused, naming what to do.
	s = *three
	s.Frontends = []fleet.Frontend{{Name: "other", Region: "local", NodeID: "other"}}
	other, err := fleet.New(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.UpdateFleet(other); err == nil || !strings.Contains(err.Error(), "restart the control plane") {
		t.Errorf("a fleet with other frontends: err = %v", err)
	}
}
