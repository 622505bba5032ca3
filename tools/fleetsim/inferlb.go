package fleetsim

import (
	"context"
	"errors"
	"math"
	"net"
	"slices"
	"strconv"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/inferlb/inferlb/api/fleet"
	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/controlplane"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/extproc/body"
	"github.com/inferlb/inferlb/extproc/cpclient"
	"github.com/inferlb/inferlb/internal/envoylb"
	"github.com/inferlb/inferlb/internal/tokens/hf"
	"github.com/inferlb/inferlb/xds/translate"
)

// plane is the simulated control plane's signal side: the scrape loop into
// a signals.Tracker (smoothing, staleness, up/down) and, for inferlb, the
// Reports intake.
type plane struct {
	s       *Sim
	tracker *signals.Tracker
	intake  *signals.Intake
	kicked  bool
}

// Production periods of controlplane.DefaultRunConfig.
var runDefaults = controlplane.DefaultRunConfig()

// reportBacklog is cpclient.Reporter's default MaxBacklog.
const reportBacklog = 30 * time.Second

func newPlane(s *Sim, intake bool) (*plane, error) {
	var ids, nodes, classes, prios []string
	for _, e := range s.spec.Engines {
		ids = append(ids, e.ID)
	}
	pl := &plane{s: s, tracker: signals.NewTracker(signals.TrackerOptions{Smoothing: runDefaults.Smoothing, StaleAfter: runDefaults.StaleAfter}, ids)}
	if intake {
		for _, f := range s.spec.Frontends {
			nodes = append(nodes, f.NodeID)
		}
		for _, c := range s.spec.Classes {
			classes = append(classes, c.Name)
		}
		for _, p := range s.spec.Priorities {
			prios = append(prios, p.Name)
		}
		in, err := signals.NewIntake(signals.IntakeOptions{Window: runDefaults.DemandWindow, Nodes: nodes, Classes: classes,
			Priorities: prios, Now: s.wall})
		if err != nil {
			return nil, err
		}
		pl.intake = in
	}
	return pl, nil
}

// errRefused is what scraping a crashed engine gets.
var errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

// scrape samples every engine's /metrics and /health now; it returns
// whether an engine's up/down verdict changed (the runner then runs a cycle
// at once).
func (pl *plane) scrape() bool {
	s := pl.s
	at := s.wall()
	changed := false
	for _, e := range s.engines {
		smp := signals.Sample{ID: e.spec.ID, At: at}
		switch {
		case e.down:
			smp.HealthErr, smp.MetricsErr = errRefused, errRefused
		case e.hung:
			smp.HealthErr, smp.MetricsErr = context.DeadlineExceeded, context.DeadlineExceeded
		default:
			e.reps.Advance(s.now)
			st := e.reps.Stats()
			smp.Healthy = true
			smp.Metrics = signals.Metrics{Running: float64(st.Running), Waiting: float64(st.Waiting), KVUsage: st.KVUsage,
				PrefixHits: float64(st.PrefixHits), PrefixQueries: float64(st.PrefixQueries),
				TTFTSum: e.ttftSum, TTFTCount: e.ttftCount, TTFTBuckets: e.ttftBuckets(), ITLSum: e.itlSum, ITLCount: e.itlCount,
				Success: e.success, PromptTokens: float64(st.PromptTokens), GenTokens: float64(st.GenerationTokens)}
			s.schedule(e)
		}
		if pl.tracker.Observe(smp) {
			changed = true
		}
	}
	return changed
}

// staticPolicy is a RoutingPolicy with the fleet's classes and priorities
// and nothing else (no shedding, no retries): how the rivals that use
// ext_proc's classes and keys see requests.
func staticPolicy(s *Sim, node, prefix string) *policyv1.RoutingPolicy {
	rp := &policyv1.RoutingPolicy{NodeId: node, Version: "static"}
	prios := slices.Clone(s.spec.Priorities)
	slices.SortFunc(prios, func(a, b fleet.Priority) int { return a.Level - b.Level })
	for _, p := range prios {
		rp.Priorities = append(rp.Priorities, &policyv1.Priority{Name: p.Name, Level: uint32(p.Level)})
	}
	if len(prios) > 0 {
		rp.DefaultPriority = prios[len(prios)/2].Name
	}
	for _, c := range s.spec.Classes {
		rp.Classes = append(rp.Classes, &policyv1.ClassPolicy{Name: c.Name, Cluster: prefix + c.Name, Model: c.Model,
			Residency: c.Residency, MinContextTokens: uint32(c.MinContextTokens), MaxContextTokens: uint32(c.ContextLimit),
			MeanOutputTokens: uint32(c.MeanOutputTokens)})
		if m, ok := s.spec.ModelByName(c.Model); ok {
			last := rp.Classes[len(rp.Classes)-1]
			last.TokenizerSha256, last.ChatTemplateTokens = m.TokenizerSHA256, uint32(m.ChatTemplateTokens)
		}
	}
	for _, e := range s.spec.Engines {
		rp.Engines = append(rp.Engines, &policyv1.EngineRef{Id: e.ID, Address: e.Address, Region: e.Region})
	}
	return rp
}

// newDecider is a frontend's ext_proc decisions, with the simulator's
// tokenizer loaded (tokenizer.go).
func newDecider(s *Sim) *extproc.Decider {
	d := extproc.NewDecider(s.wall())
	d.SetTokenizers(map[string]*hf.Tokenizer{s.tok.SHA256(): s.tok})
	d.SetPrefillPlacement(s.opt.PrefillPlacement)
	d.SetIdlePlacement(s.opt.IdlePlacement)
	d.SetCachePlacement(s.opt.CachePlacement)
	return d
}

// decided is the per-request state of the policies that run ext_proc's
// Decider.
type decided struct {
	dc extproc.Decision
	cl *lbCluster
}

// decide runs ext_proc's decision on the request's real body. It returns
// the outcome; an admitted request's decision is kept in p.state.
func decide(d *extproc.Decider, p *request) outcome {
	in := extproc.Input{Kind: body.Chat, Priority: p.w.Priority, Body: chatBody(p), Now: p.sim.wall()}
	if p.w.SessionID != "" {
		in.Session = p.w.SessionID
	}
	st := &decided{}
	if rej := d.Decide(in, &st.dc); rej != nil {
		if rej.Shed() {
			return outcomeShed
		}
		return outcomeRejected
	}
	p.state = st
	p.retries = st.dc.Retries
	p.key = envoylb.HeaderHash(st.dc.AffinityHeader())
	return outcomeAdmitted
}

// inferlb: the project itself. Each frontend runs ext_proc's Decider; the
// control plane runs controlplane.Controller.Step on the tracker's signals
// and the intake's demand at the control interval; each node's resources
// (RoutingPolicy, EDS) are applied to its Decider and to the envoylb model
// of its Envoy's Maglev clusters.
type inferlb struct {
	s       *Sim
	pl      *plane
	ctrl    *controlplane.Controller
	cfg     controlplane.Config
	lbCfg   envoylb.Config
	dec     []*extproc.Decider
	applied []*translate.Resources
	// clusters[f][cluster name]
	clusters []map[string]*lbCluster
	addr     map[string]int
	warm     bool
	pending  []*policyv1.ReportRequest // per frontend: a refused report
	last     map[string]map[string]map[string]float64
}

func lbConfig(o translate.Options) envoylb.Config {
	c := envoylb.Config{Policy: envoylb.Maglev, TableSize: o.MaglevTableSize, RingMin: o.RingMinSize, RingMax: o.RingMaxSize,
		HashBalanceFactor: o.HashBalanceFactor, PanicThreshold: o.HealthyPanicThreshold}
	if o.LBPolicy == translate.RingHash {
		c.Policy = envoylb.RingHash
	}
	return c
}

// newInferlb runs the control plane on spec: the scenario's fleet, or a
// variant of it (affinityOff).
func newInferlb(s *Sim, spec *fleet.Spec) (*inferlb, error) {
	pl, err := newPlane(s, true)
	if err != nil {
		return nil, err
	}
	cfg := controlplane.DefaultConfig()
	if s.opt.BalanceFactor != nil {
		cfg.BalanceFactor = *s.opt.BalanceFactor
	}
	ctrl, err := controlplane.NewController(spec, cfg, nil)
	if err != nil {
		return nil, err
	}
	x := &inferlb{s: s, pl: pl, ctrl: ctrl, cfg: cfg, lbCfg: lbConfig(cfg.Translate), addr: map[string]int{}}
	for i, e := range s.spec.Engines {
		x.addr[e.Address] = i
	}
	for range s.fronts {
		x.dec = append(x.dec, newDecider(s))
		x.clusters = append(x.clusters, map[string]*lbCluster{})
	}
	x.applied = make([]*translate.Resources, len(s.fronts))
	x.pending = make([]*policyv1.ReportRequest, len(s.fronts))
	return x, nil
}

// affinityOff is spec with cache affinity off for every class, as an
// operator sets it with classes[].affinity.mode: off; the control plane
// publishes it in RoutingPolicy and ext_proc gives every request a fresh
// key. The scenario's spec is shared by policies running at once: the
// classes are copied, not changed.
func affinityOff(spec *fleet.Spec) *fleet.Spec {
	sp := *spec
	sp.Classes = slices.Clone(spec.Classes)
	for i := range sp.Classes {
		sp.Classes[i].Affinity.Mode = fleet.AffinityOff
	}
	return &sp
}

func (x *inferlb) Start() {
	x.s.q.push(event{t: 0, kind: evScrape})
	x.s.q.push(event{t: runDefaults.Warmup, kind: evCycle, a: 1})
	x.s.q.push(event{t: x.s.sc.Control.ReportInterval, kind: evReport})
}

func (x *inferlb) Event(ev event) {
	s := x.s
	switch ev.kind {
	case evScrape:
		if x.pl.scrape() && x.warm && !x.pl.kicked {
			x.pl.kicked = true
			s.q.push(event{t: s.now, kind: evCycle, a: 2})
		}
		s.q.push(event{t: s.now + s.sc.Control.ScrapeInterval, kind: evScrape})
	case evReport:
		// As extproc/cpclient's Reporter does: a report the intake refuses
		// is merged into the next one, for at most its backlog (30 s).
		for i, d := range x.dec {
			now := s.wall()
			rep := d.Observer().Flush(now)
			rep.NodeId, rep.Instance = s.fronts[i].spec.NodeID, "sim"
			if p := x.pending[i]; p != nil {
				if now.Sub(p.GetIntervalStart().AsTime()) > reportBacklog {
					s.rec.note("a frontend dropped its unsent report backlog")
				} else {
					rep = cpclient.Merge(p, rep)
				}
				x.pending[i] = nil
			}
			if len(rep.Demand) == 0 && len(rep.Engines) == 0 {
				continue // the reporter sends nothing for an empty interval
			}
			if err := x.pl.intake.Report(s.ctx, rep); err != nil {
				s.rec.noteDetail("the control plane's intake refused ext_proc's report (merged into the next)", err.Error())
				x.pending[i] = rep
			}
		}
		s.q.push(event{t: s.now + s.sc.Control.ReportInterval, kind: evReport})
	case evCycle:
		switch ev.a {
		case 1: // warm-up over: wait for every frontend's report, at most a demand window
			if !x.allReported() && s.now < runDefaults.Warmup+runDefaults.DemandWindow {
				s.q.push(event{t: s.now + s.sc.Control.ScrapeInterval, kind: evCycle, a: 1})
				return
			}
			x.warm = true
		case 2:
			x.pl.kicked = false
		}
		x.cycle()
		if ev.a != 2 {
			s.q.push(event{t: s.now + s.sc.Control.Interval, kind: evCycle})
		}
	}
}

func (x *inferlb) allReported() bool {
	seen := x.pl.intake.Status().LastReport
	for _, f := range x.s.spec.Frontends {
		if _, ok := seen[f.NodeID]; !ok {
			return false
		}
	}
	return true
}

func (x *inferlb) cycle() {
	s := x.s
	now := s.wall()
	dem, ev := x.pl.intake.Snapshot(now)
	res, err := x.ctrl.Step(s.ctx, controlplane.Inputs{Now: now, Engines: x.pl.tracker.Engines(now), Demand: dem, Evidence: ev,
		DemandWindow: runDefaults.DemandWindow, Prefixes: x.pl.intake.Prefixes(now), Instances: x.pl.intake.Instances(now)})
	if err != nil {
		s.rec.noteDetail("control cycle failed", err.Error())
		return
	}
	for i, f := range s.fronts {
		nd := res.Nodes[f.spec.NodeID]
		if nd == nil || nd.Resources == x.applied[i] {
			continue
		}
		if err := x.apply(i, nd.Resources); err != nil {
			s.rec.noteDetail("applying a node's resources failed", f.spec.NodeID+": "+err.Error())
			continue
		}
		x.applied[i] = nd.Resources
	}
	pub := x.ctrl.Published()
	s.rec.cycle(pub, x.last)
	x.last = pub
}

// apply installs a node's resources: the policy into its Decider, the EDS
// assignments into its clusters.
func (x *inferlb) apply(f int, r *translate.Resources) error {
	if _, _, err := x.dec[f].SetPolicy(r.Policy); err != nil {
		return err
	}
	// The class clusters' bounded-load factors (CDS): a class the control
	// plane tightened has its own (controlplane/boundedload.go).
	factor := map[string]uint32{}
	for _, c := range r.Clusters {
		factor[c.GetName()] = c.GetCommonLbConfig().GetConsistentHashingLbConfig().GetHashBalanceFactor().GetValue()
	}
	for _, cla := range r.Endpoints {
		cfg := x.lbCfg
		cfg.HashBalanceFactor = factor[cla.ClusterName]
		cl := x.clusters[f][cla.ClusterName]
		if cl == nil {
			cl = &lbCluster{cfg: cfg}
			x.clusters[f][cla.ClusterName] = cl
		}
		cl.cfg = cfg // set rebuilds the table with it, as Envoy does on a cluster update
		js, w, pr, ok, err := edsHosts(cla, x.addr)
		if err != nil {
			return err
		}
		if err := cl.set(x.s, js, w, pr, ok); err != nil {
			return err
		}
	}
	return nil
}

// edsHosts reads a ClusterLoadAssignment in Envoy's host order: engines,
// weights, priorities and whether EDS calls each healthy (HEALTHY and
// UNKNOWN are, for Envoy).
func edsHosts(cla *endpointv3.ClusterLoadAssignment, addr map[string]int) (js []int, w, pr []uint32, ok []bool, err error) {
	for _, loc := range cla.GetEndpoints() {
		for _, lbe := range loc.GetLbEndpoints() {
			sa := lbe.GetEndpoint().GetAddress().GetSocketAddress()
			a := net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
			j, found := addr[a]
			if !found {
				return nil, nil, nil, nil, errors.New("EDS names an unknown address " + a)
			}
			js = append(js, j)
			w = append(w, lbe.GetLoadBalancingWeight().GetValue())
			pr = append(pr, loc.GetPriority())
			h := lbe.GetHealthStatus()
			ok = append(ok, h == corev3.HealthStatus_HEALTHY || h == corev3.HealthStatus_UNKNOWN)
		}
	}
	return js, w, pr, ok, nil
}

func (x *inferlb) Admit(p *request) outcome {
	o := decide(x.dec[p.front.ix], p)
	if o == outcomeAdmitted && x.s.opt.Keys != nil {
		// The affinity key, before prefill-aware placement.
		x.s.opt.Keys(p.conv, p.arrival, envoylb.HeaderHash(p.state.(*decided).dc.UnplacedHeader()))
	}
	return o
}

func (x *inferlb) Pick(p *request) int {
	st := p.state.(*decided)
	if st.cl == nil {
		st.cl = x.clusters[p.front.ix][st.dc.Class.Cluster]
	}
	return st.cl.pick(p)
}

func (x *inferlb) Attempted(p *request, failed bool) {
	st := p.state.(*decided)
	st.cl.release(p)
	if failed {
		// Envoy's upstream log reaches ext_proc's access-log service: a
		// failed attempt, charged as a retry if the request has one left
		// (Envoy then retries), and evidence against the engine.
		d := x.dec[p.front.ix]
		d.ChargeRetry(&st.dc.Held)
		d.Failed(x.s.spec.Engines[p.engine].Address)
	}
}

func (x *inferlb) Done(p *request, out outcome) {
	st, ok := p.state.(*decided)
	if !ok {
		return
	}
	// Envoy's request log reports the end: the in-flight slot is freed,
	// and a served request is evidence with its upstream timing (response
	// headers come back a round trip after sending, as engines stream at
	// once; the last byte a one-way delay after the last token).
	d := x.dec[p.front.ix]
	d.Release(&st.dc.Held)
	if out == outcomeServed && p.engine >= 0 {
		owd := p.front.owd[p.engine]
		d.Finished(&st.dc.Held, x.s.spec.Engines[p.engine].Address, 200, 2*owd, p.mr.LastToken-p.mr.Arrival+2*owd, true)
	}
}

func (x *inferlb) HealthChanged(int) {
	for _, m := range x.clusters {
		for _, cl := range m {
			_ = cl.rebuild(x.s)
		}
	}
}

func (x *inferlb) Weights() map[string]float64 {
	return firstWeights(x.s, x.ctrl.Published())
}

// firstWeights is the first frontend's first class's shares.
func firstWeights(s *Sim, pub map[string]map[string]map[string]float64) map[string]float64 {
	return pub[s.spec.Frontends[0].NodeID][s.spec.Classes[0].Name]
}

// oldController: the seed's design. ext_proc's eligibility and affinity key
// (a static policy: no shedding, no retries), weighted consistent hashing
// (Envoy Maglev with bounded loads), and a periodic proportional
// controller: every control interval each engine's weight moves by its
// score (its load: the smoothed running + waiting requests of its scrapes)
// against the fleet average, w ← w·(1 + gain·(avg − score)/avg), one weight
// vector for every frontend. Proportional only, on a delayed signal: it
// overshoots and swings.
type oldController struct {
	s        *Sim
	pl       *plane
	lbCfg    envoylb.Config
	dec      []*extproc.Decider
	weights  [][]float64 // class → engine-in-class shares
	floor    [][]float64
	clusters [][]*lbCluster // frontend → class
	last     map[string]map[string]map[string]float64
}

func newOldController(s *Sim) (*oldController, error) {
	pl, err := newPlane(s, false)
	if err != nil {
		return nil, err
	}
	o := &oldController{s: s, pl: pl, lbCfg: lbConfig(translate.DefaultOptions())}
	for _, f := range s.fronts {
		d := newDecider(s)
		if _, _, err := d.SetPolicy(staticPolicy(s, f.spec.NodeID, "old_")); err != nil {
			return nil, err
		}
		o.dec = append(o.dec, d)
	}
	for c, js := range s.classEngines {
		w := make([]float64, len(js))
		fl := make([]float64, len(js))
		refP, refO, ok := controlplane.ReferenceShape(s.spec, s.spec.Classes[c].Model)
		for i, j := range js {
			w[i] = 1
			if fp, found := s.spec.ProfileOf(s.spec.Engines[j]); found && ok {
				if prof, err := controlplane.ProfileFromFleet(fp, refP, refO); err == nil {
					w[i] = prof.CapacityRPS * float64(max(s.spec.Engines[j].Replicas, 1)) // start proportional to capacity
				}
			}
		}
		normalize(w)
		for i := range w {
			fl[i] = 0.02 * w[i] // an engine keeps a trickle, to be measured
		}
		o.weights, o.floor = append(o.weights, w), append(o.floor, fl)
	}
	for range s.fronts {
		row := make([]*lbCluster, len(s.classEngines))
		for c := range row {
			row[c] = &lbCluster{cfg: o.lbCfg}
		}
		o.clusters = append(o.clusters, row)
	}
	o.publish()
	return o, nil
}

func normalize(w []float64) {
	sum := 0.0
	for _, v := range w {
		sum += v
	}
	for i := range w {
		if sum > 0 {
			w[i] /= sum
		}
	}
}

func (o *oldController) Start() {
	o.s.q.push(event{t: 0, kind: evScrape})
	o.s.q.push(event{t: o.s.sc.Control.Interval, kind: evCycle})
}

func (o *oldController) Event(ev event) {
	s := o.s
	switch ev.kind {
	case evScrape:
		o.pl.scrape()
		s.q.push(event{t: s.now + s.sc.Control.ScrapeInterval, kind: evScrape})
	case evCycle:
		o.control()
		s.q.push(event{t: s.now + s.sc.Control.Interval, kind: evCycle})
	}
}

// control is one proportional step per class.
func (o *oldController) control() {
	s := o.s
	view := map[string]signals.Engine{}
	for _, e := range o.pl.tracker.Engines(s.wall()) {
		view[e.ID] = e
	}
	gain := s.sc.Control.OldGain
	for c, js := range s.classEngines {
		score := make([]float64, len(js))
		sum, n := 0.0, 0
		for i, j := range js {
			v := view[s.spec.Engines[j].ID]
			score[i] = math.NaN()
			if v.Status() == signals.Up {
				score[i] = v.Running + v.Waiting
				sum += score[i]
				n++
			}
		}
		if n == 0 || sum <= 0 {
			continue
		}
		avg := sum / float64(n)
		w := o.weights[c]
		for i := range js {
			if math.IsNaN(score[i]) {
				continue
			}
			w[i] *= math.Max(1+gain*(avg-score[i])/avg, 0)
			w[i] = math.Max(w[i], o.floor[c][i])
		}
		normalize(w)
	}
	o.publish()
}

// publish turns the shares into every frontend's EDS by xds/translate's
// rule (translate.EndpointWeights, integers of 1000).
func (o *oldController) publish() {
	s := o.s
	pub := map[string]map[string]map[string]float64{}
	for f := range s.fronts {
		node := s.spec.Frontends[f].NodeID
		pub[node] = map[string]map[string]float64{}
		for c, js := range s.classEngines {
			shares := map[string]float64{}
			for i, j := range js {
				shares[s.spec.Engines[j].ID] = o.weights[c][i]
			}
			pub[node][s.spec.Classes[c].Name] = shares
			ew := translate.EndpointWeights(shares, 1000)
			w, pr, ok := make([]uint32, len(js)), make([]uint32, len(js)), make([]bool, len(js))
			for i, j := range js {
				e := ew[s.spec.Engines[j].ID]
				w[i], pr[i], ok[i] = e.Weight, e.Priority, true
			}
			_ = o.clusters[f][c].set(s, slices.Clone(js), w, pr, ok)
		}
	}
	s.rec.cycle(pub, o.last)
	o.last = pub
}

func (o *oldController) Admit(p *request) outcome { return decide(o.dec[p.front.ix], p) }

// cluster is the request's class's cluster (the class ext_proc chose).
func (o *oldController) cluster(p *request) *lbCluster {
	return o.clusters[p.front.ix][o.s.classIx[p.state.(*decided).dc.Class.Name]]
}

func (o *oldController) Pick(p *request) int {
	st := p.state.(*decided)
	if st.cl == nil {
		st.cl = o.cluster(p)
	}
	return st.cl.pick(p)
}

func (o *oldController) Attempted(p *request, _ bool) { p.state.(*decided).cl.release(p) }

func (o *oldController) Done(p *request, _ outcome) {
	if st, ok := p.state.(*decided); ok {
		o.dec[p.front.ix].Release(&st.dc.Held)
	}
}

func (o *oldController) HealthChanged(int) {
	for _, row := range o.clusters {
		for _, cl := range row {
			_ = cl.rebuild(o.s)
		}
	}
}

func (o *oldController) Weights() map[string]float64 { return firstWeights(o.s, o.last) }
