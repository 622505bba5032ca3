// Package picker is the endpoint-picker mode of `inferlb extproc`: the
// Gateway API Inference Extension's endpoint picker protocol (v1.0) over
// Envoy's ext_proc, so the gateways mesh operators already run (Istio,
// Envoy Gateway, kgateway, GKE Gateway, agentgateway, or a plain Envoy with
// an ORIGINAL_DST cluster or the override_host load-balancing policy) route
// LLM requests through inferlb. See docs/endpoint-picker.md.
//
// The decision is the one inferlb's own frontend Envoys make: the Server's
// Decider classifies the request, derives its cache-affinity key and admits
// or sheds it; then, instead of handing the key to Envoy's Maglev cluster,
// the picker puts the key through the same weighted Maglev (or ring hash)
// table with bounded loads (internal/envoylb), built from the endpoints,
// weights and health the control plane published to this frontend. Both
// modes route the same request to the same engine.
//
// The protocol, as the picker speaks it:
//   - the gateway may restrict the pick to a subset, in the request's
//     metadata_context under envoy.lb.subset_hint, key
//     x-gateway-destination-endpoint-subset (a list of "ip:port");
//   - the answer names the primary endpoint and its fallbacks ("ip:port",
//     comma-separated) in the x-gateway-destination-endpoint request header
//     and in dynamic metadata envoy.lb / x-gateway-destination-endpoint,
//     the same value in both;
//   - 503 when no endpoint is ready (none healthy, or none of the subset),
//     429 when the request is shed;
//   - on the response, the gateway reports the endpoint that served in
//     metadata_context envoy.lb / x-gateway-destination-endpoint-served: the
//     picker's evidence about engines (status, time to headers, completion);
//   - gRPC health services "liveness", "readiness" and
//     "envoy.service.ext_proc.v3.ExternalProcessor" (ready once a routing
//     policy is held).
//
// Both request body modes gateways use work: FULL_DUPLEX_STREAMED (llm-d's
// and the reference EPP's: the answer to the request headers waits for the
// whole body, then the body is sent back unchanged) and BUFFERED.
package picker

import (
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/inferlb/inferlb/api/headers"
	"github.com/inferlb/inferlb/extproc"
)

// The protocol's names (endpoint picker protocol v1.0).
const (
	// SubsetNamespace and SubsetKey: where the gateway puts the subset of
	// endpoints the pick must come from.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// DestinationNamespace and DestinationKey: the dynamic-metadata
	// namespace and key (and the header) of the picked endpoints.
	DestinationNamespace = "envoy.lb"
	DestinationKey       = "x-gateway-destination-endpoint"
	// ServedKey: the endpoint that served, reported by the gateway in the
	// response's metadata_context under DestinationNamespace.
	ServedKey = "x-gateway-destination-endpoint-served"
)

// The gRPC health services the protocol names.
const (
	LivenessService  = "liveness"
	ReadinessService = "readiness"
	ExtProcService   = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// DefaultFallbacks is how many fallback endpoints follow the primary: none,
// because an ORIGINAL_DST cluster (llm-d's and the reference EPP's gateway
// configuration) parses the header as one address: Envoy 1.40 answers a
// list "a,b" with no upstream host at all (TestEndpointPickerRoutesLikeEnvoy
// saw it). Gateways on the override_host policy (Istio, Envoy Gateway) take
// the list and try it in order on retries: give them fallbacks
// (--picker-fallbacks).
const DefaultFallbacks = 0

// Options configure a Picker.
type Options struct {
	// Fallbacks is how many endpoints follow the primary in the answer
	// (0: none).
	Fallbacks int
	Logger    *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Picker is the endpoint-picker ext_proc service. It shares the Server's
// Decider, metrics and error answers.
type Picker struct {
	extprocv3.UnimplementedExternalProcessorServer

	srv    *extproc.Server
	dec    *extproc.Decider
	opt    Options
	log    *slog.Logger
	m      *metrics
	tables tableCache
	health *health.Server
}

// New returns a Picker over srv's decisions.
func New(srv *extproc.Server, opt Options) *Picker {
	opt.Fallbacks = max(opt.Fallbacks, 0)
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	p := &Picker{srv: srv, dec: srv.Decider(), opt: opt, log: opt.Logger, m: newMetrics(srv.Registry()), health: health.NewServer()}
	p.tables.loads, p.tables.total = map[string]map[string]int{}, map[string]int{}
	p.health.SetServingStatus(LivenessService, healthpb.HealthCheckResponse_SERVING)
	p.UpdateReadiness()
	return p
}

// Register adds the picker's ext_proc service, the server's access-log
// service (a gateway may send its logs too) and the health services to a
// gRPC server.
func (p *Picker) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, p)
	p.srv.RegisterAccessLog(g)
	healthpb.RegisterHealthServer(g, p.health)
}

// UpdateReadiness sets the readiness services from the policy in force:
// ready once one is held (until then every request would be answered 503).
// Call it after each policy change.
func (p *Picker) UpdateReadiness() {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if p.dec.Policy() != nil {
		st = healthpb.HealthCheckResponse_SERVING
	}
	p.health.SetServingStatus(ReadinessService, st)
	p.health.SetServingStatus(ExtProcService, st)
	p.health.SetServingStatus("", st)
}

// Shutdown marks every health service NOT_SERVING (a draining replica).
func (p *Picker) Shutdown() { p.health.Shutdown() }

// request is one HTTP request's state on its stream.
type request struct {
	head   extproc.RequestHead
	subset []string // nil: no hint; empty: a hint naming nothing
	hinted bool
	// duplex: the answer to the request headers waits for the body
	// (FULL_DUPLEX_STREAMED); respDuplex: response body chunks are
	// answered with their own bytes.
	duplex, respDuplex bool
	headersSeen        bool
	body               []byte
	decided            bool
	dc                 extproc.Decision
	admitted           bool
	class              string
	counted            string   // address counted in the class's load
	eps                []string // the endpoints answered, primary first
	start, respStart   time.Time
	served             string
	status             int
	finished           bool
}

// Process serves one ext_proc stream: one HTTP request, from its headers to
// the end of its response.
func (p *Picker) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	p.m.streams.Inc()
	defer p.m.streams.Dec()
	r := &request{}
	defer p.end(r)
	for {
		req, err := srv.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		if req.GetObservabilityMode() {
			continue
		}
		if pc := req.GetProtocolConfig(); pc != nil {
			r.duplex = pc.GetRequestBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED || pc.GetSendBodyWithoutWaitingForHeaderResponse()
			r.respDuplex = pc.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		resps, done, err := p.step(r, req)
		if err != nil {
			p.log.Warn("endpoint picker: ext_proc protocol error", "err", err)
			return status.Error(codes.FailedPrecondition, err.Error())
		}
		for _, resp := range resps {
			if err := srv.Send(resp); err != nil {
				return err
			}
		}
		if done {
			return nil
		}
	}
}

// step advances a request by one message: the answers to send, and whether
// the stream is over for the picker (an ImmediateResponse ended it).
func (p *Picker) step(r *request, req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, bool, error) {
	switch v := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if r.headersSeen {
			return nil, false, errors.New("request headers twice")
		}
		r.headersSeen = true
		r.start = p.opt.Now()
		r.subset, r.hinted = subsetHint(req.GetMetadataContext())
		head, answer := p.srv.ReadHead(v.RequestHeaders)
		r.head = head
		if answer != nil {
			return one(answer), true, nil
		}
		if r.duplex {
			return nil, false, nil // answered with the body
		}
		return one(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}), false, nil
	case *extprocv3.ProcessingRequest_RequestBody:
		if !r.headersSeen || r.decided {
			return nil, false, errors.New("request body out of order")
		}
		r.body = append(r.body, v.RequestBody.GetBody()...)
		if len(r.body) > p.srv.BodyLimit() {
			return one(p.srv.TooLarge(len(r.body))), true, nil
		}
		if !v.RequestBody.GetEndOfStream() {
			if !r.duplex {
				// BUFFERED sends the body whole; chunks mean STREAMED,
				// whose chunks each want an answer the picker cannot give
				// before it has decided.
				return nil, false, errors.New("request body arrived in chunks; configure request_body_mode FULL_DUPLEX_STREAMED or BUFFERED")
			}
			return nil, false, nil
		}
		return p.decide(r, false)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if !r.decided {
			// FULL_DUPLEX_STREAMED with trailers: they end the body.
			resps, done, err := p.decide(r, true)
			if err != nil || done {
				return resps, done, err
			}
			return append(resps, trailersResp(true)), false, nil
		}
		return one(trailersResp(true)), false, nil
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		p.observeHeaders(r, req)
		resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		if v.ResponseHeaders.GetEndOfStream() {
			p.finish(r)
		}
		return one(resp), false, nil
	case *extprocv3.ProcessingRequest_ResponseBody:
		b := v.ResponseBody
		if b.GetEndOfStream() {
			p.finish(r)
		}
		if r.respDuplex {
			return one(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
					StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b.GetBody(), EndOfStream: b.GetEndOfStream()}}}}}}}), false, nil
		}
		return one(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}), false, nil
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		p.finish(r)
		return one(trailersResp(false)), false, nil
	}
	return nil, false, nil // messages of later protocol versions: nothing to answer
}

func one(r *extprocv3.ProcessingResponse) []*extprocv3.ProcessingResponse {
	return []*extprocv3.ProcessingResponse{r}
}

func trailersResp(request bool) *extprocv3.ProcessingResponse {
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
}

// decide makes the request's decision once its body is whole, and answers
// with the endpoints (or ends the request with an error).
func (p *Picker) decide(r *request, byTrailers bool) ([]*extprocv3.ProcessingResponse, bool, error) {
	r.decided = true
	in := r.head.In
	in.Body = r.body
	rej := p.dec.Decide(in, &r.dc)
	if rej != nil {
		if rej.Shed() {
			p.srv.CountDecision(&r.dc)
			p.m.picks.WithLabelValues(r.dc.Class.Name, "shed").Inc()
		}
		return one(p.srv.RejectResponse(rej)), true, nil
	}
	r.admitted = true
	r.class = r.dc.Class.Name
	p.srv.CountDecision(&r.dc)
	eps, reason := p.pick(r)
	if len(eps) == 0 {
		p.m.picks.WithLabelValues(r.class, reason).Inc()
		msg := "No ready endpoint serves " + r.class + " at this gateway; retry shortly."
		if reason == "subset_unavailable" {
			msg = "None of the endpoints the gateway allowed for this request (" + SubsetKey + ") is ready for " + r.class + "."
		}
		p.release(r)
		return one(p.srv.Unavailable(reason, msg)), true, nil
	}
	p.m.picks.WithLabelValues(r.class, "picked").Inc()
	r.eps = eps
	if len(eps) > 1 {
		p.m.fallbacks.Observe(float64(len(eps) - 1))
	}
	value := strings.Join(eps, ",")
	set := []*corev3.HeaderValueOption{
		extproc.SetHeader(DestinationKey, value),
		extproc.SetHeader(headers.AffinityKey, r.dc.AffinityHeader()),
		extproc.SetHeader(headers.EnvoyMaxRetries, strconv.Itoa(r.dc.Retries)),
	}
	if rg := r.dc.Policy.Region; rg != "" {
		set = append(set, extproc.SetHeader(headers.SourceRegion, rg))
	}
	mut := &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: keepSet(r.head.Remove)}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		DestinationNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			DestinationKey: structpb.NewStringValue(value),
		}}),
	}}
	if !r.duplex {
		return one(&extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: mut}}},
			DynamicMetadata: md,
		}), false, nil
	}
	// FULL_DUPLEX_STREAMED: the headers' answer (with the endpoints), then
	// the body as it came.
	hdr := &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: mut}}},
		DynamicMetadata: md,
	}
	bd := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: r.body, EndOfStream: !byTrailers}}}}}}}
	return []*extprocv3.ProcessingResponse{hdr, bd}, false, nil
}

// keepSet drops from the strip list the headers the answer sets.
func keepSet(rm []string) []string {
	out := rm[:0]
	for _, k := range rm {
		if k == headers.AffinityKey || k == headers.EnvoyMaxRetries || k == headers.SourceRegion {
			continue
		}
		out = append(out, k)
	}
	return out
}

// subsetHint reads the gateway's subset hint: ok when the key is set (a
// list of "ip:port", possibly empty).
func subsetHint(md *corev3.Metadata) (subset []string, ok bool) {
	ns := md.GetFilterMetadata()[SubsetNamespace]
	if ns == nil {
		return nil, false
	}
	v, ok := ns.GetFields()[SubsetKey]
	if !ok {
		return nil, false
	}
	subset = []string{}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if s := e.GetStringValue(); s != "" {
				subset = append(subset, s)
			}
		}
	case *structpb.Value_StringValue:
		// Some gateways send one comma-separated string.
		for _, s := range strings.Split(k.StringValue, ",") {
			if s = strings.TrimSpace(s); s != "" {
				subset = append(subset, s)
			}
		}
	}
	return subset, true
}

// served reads the endpoint the gateway reports as having served.
func served(md *corev3.Metadata) string {
	return md.GetFilterMetadata()[DestinationNamespace].GetFields()[ServedKey].GetStringValue()
}

// observeHeaders takes the response's status and served endpoint as
// evidence about the engine.
func (p *Picker) observeHeaders(r *request, req *extprocv3.ProcessingRequest) {
	r.respStart = p.opt.Now()
	for _, h := range req.GetResponseHeaders().GetHeaders().GetHeaders() {
		if h.Key == ":status" {
			v := h.Value
			if len(h.RawValue) > 0 {
				v = string(h.RawValue)
			}
			r.status, _ = strconv.Atoi(v)
		}
	}
	r.served = served(req.GetMetadataContext())
	if !r.admitted {
		return
	}
	if r.served == "" {
		p.m.served.WithLabelValues("missing").Inc()
		return
	}
	if r.served == r.counted {
		p.m.served.WithLabelValues("primary").Inc()
	} else {
		p.m.served.WithLabelValues("fallback").Inc()
		p.tables.move(r.class, r.counted, r.served)
		r.counted = r.served
	}
	// With the list tried in order (override_host), every endpoint
	// listed before the one that served failed its attempt: evidence the
	// gateway gives no other way.
	for _, e := range r.eps {
		if e == r.served {
			break
		}
		p.dec.Failed(e)
		// The gateway's retry used one of the request's allowance
		// (x-envoy-max-retries): charged to the class's budget, as
		// Envoy's upstream log charges it in the ext_proc mode.
		p.dec.ChargeRetry(&r.dc.Held)
	}
	if r.status >= 500 {
		p.dec.Failed(r.served)
		r.finished = true // counted: not a response to time
	}
}

// finish records the end of the response (once).
func (p *Picker) finish(r *request) {
	if r.finished || !r.admitted {
		return
	}
	r.finished = true
	if r.served != "" && r.status > 0 {
		now := p.opt.Now()
		p.dec.Finished(&r.dc.Held, r.served, r.status, r.respStart.Sub(r.start), now.Sub(r.start), true)
	}
}

// end releases what the request held when its stream ends. A response cut
// short (the stream ended before its end) counts as answered, untimed.
func (p *Picker) end(r *request) {
	if !r.finished && r.admitted && r.served != "" && r.status > 0 {
		r.finished = true
		p.dec.Finished(&r.dc.Held, r.served, r.status, r.respStart.Sub(r.start), 0, false)
	}
	p.release(r)
}

func (p *Picker) release(r *request) {
	if !r.admitted {
		return
	}
	r.admitted = false
	p.dec.Release(&r.dc.Held)
	if r.counted != "" {
		p.tables.done(r.class, r.counted)
		r.counted = ""
	}
}

type metrics struct {
	streams   prometheus.Gauge
	picks     *prometheus.CounterVec
	served    *prometheus.CounterVec
	fallbacks prometheus.Histogram
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "inferlb_picker_streams",
			Help: "Open endpoint-picker ext_proc streams (requests between their headers and the end of their response)."}),
		picks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_picker_picks_total",
			Help: "Endpoint-picker outcomes: picked, shed (429), no_ready_endpoint or subset_unavailable (503)."}, []string{"class", "outcome"}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_picker_served_total",
			Help: "Responses by who served them, from the gateway's x-gateway-destination-endpoint-served: primary, fallback, or missing (the gateway did not say)."}, []string{"by"}),
		fallbacks: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "inferlb_picker_fallbacks",
			Help: "Fallback endpoints listed after the primary.", Buckets: []float64{1, 2, 3, 4, 8}}),
	}
	reg.MustRegister(m.streams, m.picks, m.served, m.fallbacks)
	return m
}
