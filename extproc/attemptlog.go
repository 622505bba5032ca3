package extproc

import (
	"errors"
	"io"
	"net"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/inferlb/inferlb/api/headers"
)

// RequestLogName is the log_name of the bootstrap's request access log (one
// entry per admitted request, when it ends); any other log on the
// access-log service is the router's upstream log of failed attempts.
const RequestLogName = "inferlb_requests"

// attemptLog is Envoy's gRPC access-log service. It takes two logs:
//
//   - the router's upstream_log, one entry per *failed upstream attempt*
//     (5xx, reset, connect failure, timeout). A failure Envoy retried on
//     another engine never reaches the client (it gets the retry's answer),
//     so failures are counted here, per attempt; the retry it caused is
//     charged to the class's retry budget;
//   - the connection manager's request log (RequestLogName), one entry per
//     admitted request when it ends: it releases the request's in-flight
//     slot and counts the final answer when it was a success, with its
//     timing.
//
// Each attempt is so counted once, and only for a request this process
// admitted (requestTable.failure): an entry with an id it did not issue is
// counted in inferlb_extproc_unknown_request_logs_total and moves nothing.
type attemptLog struct {
	accesslogv3.UnimplementedAccessLogServiceServer
	s *Server
}

func (a attemptLog) StreamAccessLogs(stream accesslogv3.AccessLogService_StreamAccessLogsServer) error {
	requests := false // the stream's log, from its first message's identifier
	for {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return stream.SendAndClose(&accesslogv3.StreamAccessLogsResponse{})
			}
			return err
		}
		if id := msg.GetIdentifier(); id != nil {
			requests = id.GetLogName() == RequestLogName
		}
		p := a.s.dec.Policy()
		for _, e := range msg.GetHttpLogs().GetLogEntry() {
			if requests {
				a.s.requestEnded(e, p)
			} else {
				a.s.attemptFailed(e)
			}
		}
	}
}

// attemptFailed counts one entry of the upstream log: a failed attempt.
func (s *Server) attemptFailed(e *accesslogdatav3.HTTPAccessLogEntry) {
	cp := e.GetCommonProperties()
	addr := sockAddr(cp.GetUpstreamRemoteAddress())
	if addr == "" {
		return // no engine was reached (e.g. no healthy upstream)
	}
	code := int(e.GetResponse().GetResponseCode().GetValue())
	// A 2xx/4xx whose stream the engine then broke (an engine dying
	// mid-stream) is a failure too.
	cut := upstreamCut(cp)
	if code != 0 && code < 500 && !cut {
		return // not a failure (the bootstrap's filter sends only failures)
	}
	// Envoy retries only before response headers: a stream cut after them
	// uses no retry.
	retry := !cut || code == 0
	if !s.reqs.failure(s.dec, e.GetRequest().GetRequestHeaders()[headers.RequestID], retry, s.opt.Now()) {
		// Not a request this process admitted, or one of its failures
		// already counted: no evidence (a forged or replayed entry).
		s.m.unknownLogs.WithLabelValues("upstream").Inc()
		return
	}
	id := s.dec.Failed(addr)
	cc := "5xx"
	if code == 0 || code < 500 {
		cc = "reset"
	}
	s.m.responses.WithLabelValues(engineLabel(id, addr), cc).Inc()
}

// requestEnded handles one entry of the request log: an admitted request
// ended.
func (s *Server) requestEnded(e *accesslogdatav3.HTTPAccessLogEntry, p *Policy) {
	r := s.reqs.take(e.GetRequest().GetRequestHeaders()[headers.RequestID], s.opt.Now())
	if r == nil {
		s.m.unknownLogs.WithLabelValues("request").Inc()
		return
	}
	s.release(r)
	cp := e.GetCommonProperties()
	addr := sockAddr(cp.GetUpstreamRemoteAddress())
	code := int(e.GetResponse().GetResponseCode().GetValue())
	if addr == "" || code == 0 || code >= 500 || upstreamCut(cp) {
		// Failures come from the upstream log, per attempt; a stream the
		// engine cut after its headers is one of them (counting its answer
		// too would make two responses of one attempt).
		return
	}
	s.m.responses.WithLabelValues(engineLabel(p.EngineID(addr), addr), codeClass(code)).Inc()
	if placed := r.dc.placed; placed != "" {
		outcome := "picked"
		if placed != addr {
			outcome = "elsewhere"
		}
		s.m.placements.WithLabelValues(outcome).Inc()
	}
	// A request cut short (client gone, reset, idle timeout) is answered,
	// but its time says nothing about the engine's speed.
	timed := proto.Size(cp.GetResponseFlags()) == 0
	tx := dur(cp.GetTimeToFirstUpstreamTxByte())
	header := dur(cp.GetTimeToFirstUpstreamRxByte()) - tx
	total := dur(cp.GetTimeToLastUpstreamRxByte()) - tx
	if header < 0 || total < 0 {
		timed = false
	}
	s.dec.Finished(&r.dc, addr, code, header, total, timed)
	if timed {
		s.m.headerLatency.Observe(header.Seconds())
		s.m.completion.Observe(total.Seconds())
	}
}

// upstreamCut says whether the engine broke the attempt's stream (a reset
// or a closed connection), which the upstream log counts as a failure
// whatever the status it had sent.
func upstreamCut(cp *accesslogdatav3.AccessLogCommon) bool {
	f := cp.GetResponseFlags()
	return f.GetUpstreamRemoteReset() || f.GetUpstreamConnectionTermination()
}

func dur(d *durationpb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.AsDuration()
}

func engineLabel(id, addr string) string {
	if id != "" {
		return id
	}
	return addr
}

func sockAddr(a *corev3.Address) string {
	sa := a.GetSocketAddress()
	if sa == nil {
		return ""
	}
	return net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
}
