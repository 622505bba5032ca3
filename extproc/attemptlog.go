package extproc

import (
	"errors"
	"io"
	"net"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// attemptLog is Envoy's gRPC access-log service, fed by the router's
// upstream_log with one entry per *failed upstream attempt* (5xx, reset,
// connect failure, timeout). A failure Envoy retried on another engine never
// reaches ext_proc's response path (the client gets the retry's answer), so
// failures are counted here, per attempt, and the response path counts only
// the final successful responses: each attempt is counted once.
type attemptLog struct {
	accesslogv3.UnimplementedAccessLogServiceServer
	s *Server
}

func (a attemptLog) StreamAccessLogs(stream accesslogv3.AccessLogService_StreamAccessLogsServer) error {
	for {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return stream.SendAndClose(&accesslogv3.StreamAccessLogsResponse{})
			}
			return err
		}
		for _, e := range msg.GetHttpLogs().GetLogEntry() {
			addr := sockAddr(e.GetCommonProperties().GetUpstreamRemoteAddress())
			if addr == "" {
				continue // no engine was reached (e.g. no healthy upstream)
			}
			code := int(e.GetResponse().GetResponseCode().GetValue())
			if code != 0 && code < 500 {
				continue // not a failure (the bootstrap's filter sends only failures)
			}
			engine := a.s.dec.Failed(addr)
			if engine == "" {
				engine = addr
			}
			cc := "5xx"
			if code == 0 {
				cc = "reset"
			}
			a.s.m.responses.WithLabelValues(engine, cc).Inc()
		}
	}
}

func sockAddr(a *corev3.Address) string {
	sa := a.GetSocketAddress()
	if sa == nil {
		return ""
	}
	return net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
}
