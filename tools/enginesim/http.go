package enginesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/inferlb/inferlb/api/headers"
	"github.com/inferlb/inferlb/tools/enginesim/model"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.complete(w, r, true) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.complete(w, r, false) })
	mux.HandleFunc("POST /v1/chat/completions/render", func(w http.ResponseWriter, r *http.Request) { s.render(w, r, true) })
	mux.HandleFunc("POST /v1/completions/render", func(w http.ResponseWriter, r *http.Request) { s.render(w, r, false) })
	mux.HandleFunc("POST /tokenize", s.tokenize)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /version", s.showVersion)
	mux.HandleFunc("GET /health", s.health)
	// SGLang's own paths, served in either mode: routers built for SGLang
	// (sglang-router, smg) ask any worker for them, and rival routers are
	// benchmarked in front of engines in the default (vLLM) mode.
	for _, p := range []string{"/get_server_info", "/server_info"} {
		mux.HandleFunc("GET "+p, s.serverInfo)
	}
	for _, p := range []string{"/get_model_info", "/model_info"} {
		mux.HandleFunc("GET "+p, s.modelInfo)
	}
	mux.HandleFunc("GET /v1/loads", s.loads)
	mux.HandleFunc("GET /loads", s.loads)
	if s.opts.Server == ServerSGLang {
		mux.HandleFunc("GET /health_generate", s.health)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.gatherer(), promhttp.HandlerOpts{}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: 404, typ: "NotFoundError", message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		completion := r.Method == http.MethodPost && (r.URL.Path == "/v1/chat/completions" || r.URL.Path == "/v1/completions")
		if !s.enter(completion) {
			panic(http.ErrAbortHandler) // crashed: drop the connection
		}
		defer s.leave(completion)
		mux.ServeHTTP(w, r)
	})
}

// enter registers a handler with the current incarnation; false if the
// engine is down. completion says whether it serves a completion request.
func (s *Server) enter(completion bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.crashed {
		return false
	}
	s.active.Add(1)
	if completion {
		s.completing++
	}
	return true
}

// leave ends a handler enter registered.
func (s *Server) leave(completion bool) {
	if completion {
		s.mu.Lock()
		s.completing--
		s.mu.Unlock()
	}
	s.active.Done()
}

func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	_, _ = w.Write(e.body())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	fail := s.faults.HealthFail
	s.mu.Unlock()
	if s.loading() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "loading model"})
		return
	}
	if fail {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// loading reports whether the engine is still in its LoadingFor period.
func (s *Server) loading() bool {
	return s.opts.LoadingFor > 0 && !s.loaded.Load() && time.Since(s.epoch) < s.opts.LoadingFor
}

// FinishLoading ends the LoadingFor period now.
func (s *Server) FinishLoading() { s.loaded.Store(true) }

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	m := s.opts.Model
	writeJSON(w, 200, map[string]any{
		"object": "list",
		"data": []any{map[string]any{
			"id": m, "object": "model", "created": s.epoch.Unix(), "owned_by": "vllm",
			"root": m, "parent": nil, "max_model_len": s.maxCtx,
			"permission": []any{map[string]any{
				"id": "modelperm-inferlb-enginesim", "object": "model_permission", "created": s.epoch.Unix(),
				"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
				"allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false,
				"organization": "*", "group": nil, "is_blocking": false,
			}},
		}},
	})
}

// complete serves both completion endpoints.
func (s *Server) complete(w http.ResponseWriter, hr *http.Request, chat bool) {
	if s.refuseLoading(w) {
		return
	}
	s.served.Store(true) // a completion reveals SGLang's series, even one refused below
	body, ok := s.readBody(w, hr)
	if !ok {
		return
	}
	if !s.networkDelay(w, hr) {
		return
	}
	req, aerr := parseRequest(body, chat)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if aerr := s.checkModel(req.model); aerr != nil {
		writeError(w, aerr)
		return
	}
	maxTok, end, aerr := s.outputLen(req, chat)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	st := &stream{notify: make(chan struct{}, 1)}
	mr := &model.Request{Prompt: req.prompt, MaxTokens: maxTok, EndReason: end, Tag: st}
	if chat {
		mr.Output = chatOutputTokens(req.prompt, maxTok)
	}
	s.mu.Lock()
	if s.faults.ErrorRate > 0 && s.rng.Float64() < s.faults.ErrorRate {
		s.mu.Unlock()
		writeError(w, &apiError{status: 500, typ: "InternalServerError", message: "simulated engine error (fault injection)"})
		return
	}
	s.nextID++
	id := s.nextID
	var err error
	st.replica, err = s.eng.Submit(mr, s.vnow())
	crashCh := s.crashCh
	s.mu.Unlock()
	if err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	s.wake()
	rw := newResponder(s, chat, req, id, mr.Prompt)
	if req.stream {
		s.serveStream(w, hr, rw, st, mr, crashCh)
	} else {
		s.serveWhole(w, hr, rw, st, mr, crashCh)
	}
}

// checkModel answers vLLM's 404 for a model the engine does not serve; an
// empty name (allowed where vLLM defaults it) is the served model.
func (s *Server) checkModel(name string) *apiError {
	if name == "" || name == s.opts.Model {
		return nil
	}
	return &apiError{status: 404, typ: "NotFoundError", param: "model",
		message: fmt.Sprintf("The model `%s` does not exist.", name)}
}

// outputLen is the number of tokens the engine generates for req and the
// finish reason it reports (see the package doc's simulation rules), or
// vLLM's 400 when the prompt and output exceed the context limit.
func (s *Server) outputLen(req *parsedRequest, chat bool) (int, model.FinishReason, *apiError) {
	n := len(req.prompt)
	end := model.FinishLength
	maxTok := req.maxTokens
	if maxTok == 0 {
		end = model.FinishStop
		maxTok = min(s.opts.DefaultMaxTokens, s.maxCtx-n)
	}
	if n+max(maxTok, 1) > s.maxCtx {
		what := "prompt"
		if chat {
			what = "messages"
		}
		return 0, end, &apiError{status: 400, typ: "BadRequestError", param: what,
			message: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
				s.maxCtx, n+max(maxTok, 0), n, what, max(maxTok, 0), what)}
	}
	return maxTok, end, nil
}

// readBody reads a request body under the MaxBodyBytes limit; on error it
// has answered (413, or 400).
func (s *Server) readBody(w http.ResponseWriter, hr *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, hr.Body, s.opts.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, &apiError{status: 413, typ: "RequestEntityTooLarge",
				message: fmt.Sprintf("request body larger than %d bytes", mbe.Limit)})
			return nil, false
		}
		writeError(w, badRequest("reading body: %v", err))
		return nil, false
	}
	return body, true
}

// readLoaded reads a request's body once the model has loaded (503 while
// it loads, as vLLM answers): the start of the tokenize and render
// handlers.
func (s *Server) readLoaded(w http.ResponseWriter, hr *http.Request) ([]byte, bool) {
	if s.refuseLoading(w) {
		return nil, false
	}
	return s.readBody(w, hr)
}

// refuseLoading answers 503 while the model loads, as vLLM does, and says
// whether it did.
func (s *Server) refuseLoading(w http.ResponseWriter) bool {
	if !s.loading() {
		return false
	}
	writeError(w, &apiError{status: 503, typ: "ServiceUnavailableError", message: "the model is still loading"})
	return true
}

// networkDelay holds the request for the round trip from the caller's
// region; false if the client went away or the region is unknown.
func (s *Server) networkDelay(w http.ResponseWriter, hr *http.Request) bool {
	src := hr.Header.Get(headers.SourceRegion)
	label := src
	if label == "" {
		label = "none"
	}
	s.metrics.bySource.WithLabelValues(label).Inc()
	if src == "" || s.opts.Fleet == nil || s.opts.Region == "" {
		return true
	}
	rtt, err := RTT(s.opts.Fleet, src, s.opts.Region)
	if err != nil {
		writeError(w, &apiError{status: 400, typ: "BadRequestError", param: headers.SourceRegion,
			message: fmt.Sprintf("%s: %v", headers.SourceRegion, err)})
		return false
	}
	if rtt <= 0 {
		return true
	}
	t := time.NewTimer(s.real(rtt))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-hr.Context().Done():
		return false
	}
}

// abort ends mr after its client left or the engine crashed.
func (s *Server) abort(mr *model.Request) {
	s.mu.Lock()
	s.eng.Abort(mr, mr.Tag.(*stream).replica, s.vnow())
	s.mu.Unlock()
	s.wake()
}

func (s *Server) serveStream(w http.ResponseWriter, hr *http.Request, rw *responder, st *stream, mr *model.Request, crashCh chan struct{}) {
	fl, _ := w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(200)
	buf := rw.first(nil)
	if _, err := w.Write(buf); err != nil {
		s.abort(mr)
		return
	}
	if fl != nil {
		fl.Flush()
	}
	sent := 0
	for {
		if !s.await(hr, st, mr, crashCh) {
			return
		}
		n, first, cached, done, reason := st.snapshot()
		if done && reason == model.FinishAbort {
			return
		}
		buf = buf[:0]
		for ; sent < n; sent++ {
			last := done && sent == n-1
			buf = rw.token(buf, sent, last, reason)
		}
		if done {
			if rw.req.includeUsage {
				buf = rw.usage(buf, n, cached)
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		if len(buf) == 0 {
			continue
		}
		if _, err := w.Write(buf); err != nil {
			s.abort(mr)
			return
		}
		if fl != nil {
			fl.Flush()
		}
		if n >= 1 && !rw.lagged {
			rw.lagged = true
			s.lags.add(false, time.Since(s.realAt(first)))
		}
		if done {
			return
		}
	}
}

// await waits for the request's next tokens; false means the client left
// (the request is aborted). A crash of the engine aborts it and the
// connection.
func (s *Server) await(hr *http.Request, st *stream, mr *model.Request, crashCh chan struct{}) bool {
	select {
	case <-st.notify:
		return true
	case <-hr.Context().Done():
		s.abort(mr)
		return false
	case <-crashCh:
		s.abort(mr)
		panic(http.ErrAbortHandler)
	}
}

func (s *Server) serveWhole(w http.ResponseWriter, hr *http.Request, rw *responder, st *stream, mr *model.Request, crashCh chan struct{}) {
	for {
		if !s.await(hr, st, mr, crashCh) {
			return
		}
		n, _, cached, done, reason := st.snapshot()
		if !done {
			continue
		}
		if reason == model.FinishAbort {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		b := rw.whole(n, cached, reason)
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(200)
		_, _ = w.Write(b)
		return
	}
}
