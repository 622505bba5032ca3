package extproc

import (
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// The OpenAI API surface beyond what inferlb routes: GET /v1/models is
// answered by ext_proc itself from the policy's classes (clients look their
// model up before calling); endpoints inferlb does not route get a 404 in
// OpenAI's error format that names them.

// modelsPath is the OpenAI model list.
const modelsPath = "/v1/models"

// unrouted are OpenAI endpoints an engine may serve but inferlb does not
// route (their requests carry no prompt the classes are built for).
var unrouted = map[string]string{
	"/v1/responses":            "the Responses API",
	"/v1/embeddings":           "embeddings",
	"/v1/audio/transcriptions": "audio transcription",
	"/v1/audio/speech":         "speech",
	"/v1/images/generations":   "image generation",
	"/v1/moderations":          "moderations",
	"/v1/rerank":               "reranking",
	"/v1/score":                "scoring",
	"/tokenize":                "tokenization",
	"/detokenize":              "detokenization",
}

// modelObject is one entry of GET /v1/models, as OpenAI writes it, with
// vLLM's max_model_len: the longest request (prompt plus output) the model's
// largest class guarantees.
type modelObject struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
}

// models lists the policy's models, sorted by id.
func (p *Policy) models() []modelObject {
	out := make([]modelObject, 0, len(p.byModel))
	for m, cs := range p.byModel {
		longest := 0
		for _, c := range cs {
			longest = max(longest, c.guarantee())
		}
		out = append(out, modelObject{ID: m, Object: "model", OwnedBy: "inferlb", MaxModelLen: longest})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// onModels answers GET /v1/models and GET /v1/models/{id}.
func (s *Server) onModels(st *stream, method, path string) *extprocv3.ProcessingResponse {
	if method != "GET" && method != "HEAD" {
		return s.reject(st, &apiError{status: 405, typ: "invalid_request_error", code: "method_not_allowed",
			message: fmt.Sprintf("Method %s not allowed for %s; use GET.", method, path), reason: "method"})
	}
	p := s.dec.Policy()
	if p == nil {
		return s.reject(st, errNoPolicy)
	}
	list := p.models()
	var doc any = struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{"list", list}
	if rest, ok := strings.CutPrefix(path, modelsPath+"/"); ok {
		id, err := url.PathUnescape(rest)
		if err != nil {
			id = rest
		}
		i := sort.Search(len(list), func(i int) bool { return list[i].ID >= id })
		if i == len(list) || list[i].ID != id {
			return s.reject(st, &apiError{status: 404, typ: "invalid_request_error", code: "model_not_found", param: "model",
				message: fmt.Sprintf("The model %q does not exist or is not served here.", id), reason: "unknown_model"})
		}
		doc = list[i]
	}
	b, _ := json.Marshal(doc)
	st.phase = phaseAnswered
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode_OK},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			setHeader("content-type", "application/json"), setHeader("content-length", strconv.Itoa(len(b)))}},
		Body:    b,
		Details: "inferlb_models",
	}}}
}

// unroutedError is the 404 of an OpenAI endpoint inferlb does not route.
func unroutedError(method, path, what string) *apiError {
	return &apiError{status: 404, typ: "invalid_request_error", code: "unsupported_endpoint",
		message: fmt.Sprintf("%s %s (%s) is not served through this load balancer; it routes POST /v1/chat/completions and POST /v1/completions, and answers GET /v1/models.", method, path, what),
		reason:  "unsupported_endpoint"}
}
