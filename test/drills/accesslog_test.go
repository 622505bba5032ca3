package drills

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/inferlb/inferlb/api/headers"
	"github.com/inferlb/inferlb/internal/envoytest"
)

// forgedFailures is one batch of upstream-log entries: n failed attempts
// (503) at addr, with request ids the attacker made up.
func forgedFailures(addr string, n, batch int) *accesslogv3.StreamAccessLogsMessage {
	h, p, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(p)
	var entries []*accesslogdatav3.HTTPAccessLogEntry
	for i := 0; i < n; i++ {
		entries = append(entries, &accesslogdatav3.HTTPAccessLogEntry{
			CommonProperties: &accesslogdatav3.AccessLogCommon{UpstreamRemoteAddress: &corev3.Address{Address: &corev3.Address_SocketAddress{
				SocketAddress: &corev3.SocketAddress{Address: h, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)}}}}},
			Request:  &accesslogdatav3.HTTPRequestProperties{RequestHeaders: map[string]string{headers.RequestID: fmt.Sprintf("forged-%d-%d", batch, i)}},
			Response: &accesslogdatav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(503)},
		})
	}
	return &accesslogv3.StreamAccessLogsMessage{
		Identifier: &accesslogv3.StreamAccessLogsMessage_Identifier{Node: &corev3.Node{Id: nodeID}, LogName: "inferlb_upstream_failures"},
		LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: entries}}}
}

// sendAccessLogs streams the batches to ext_proc's access-log service
// (with the bearer token if given) and returns the stream's status.
func sendAccessLogs(t *testing.T, addr, token string, batches []*accesslogv3.StreamAccessLogsMessage) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	st, err := accesslogv3.NewAccessLogServiceClient(conn).StreamAccessLogs(ctx)
	if err != nil {
		return err
	}
	for _, b := range batches {
		if err := st.Send(b); err != nil {
			break // the status comes with CloseAndRecv
		}
	}
	_, err = st.CloseAndRecv()
	return err
}

// Forged access logs must not move weights: an open access-log service
// that took any failed-attempt entry as evidence would let a few forged
// entries take an engine's weight to nothing within seconds, reported on
// under ext_proc's own valid token. On a stack with a token: a stream
// without it (or with a wrong one) is refused Unauthenticated and counted;
// with the token (a compromised Envoy, or a replay), entries whose request
// ids ext_proc did not issue are counted as unknown and move nothing. The
// attacked engine keeps its penalty at 0 and its share in Envoy, and every
// real request succeeds.
//
// Without these guards the unauthenticated stream is accepted (the first
// check fails) and e0 gets the maximum penalty (0.9) within a few cycles.
func TestDrillForgedAccessLogs(t *testing.T) {
	s := startStack(t, stackOptions{auth: "token"})
	tr := s.startTraffic(trafficOptions{rate: 6, maxTokens: 16})
	tr.waitSent(t, 12, 20*time.Second)
	victim := s.engines[0].Addr()

	const batches, perBatch = 2, 6
	var forged []*accesslogv3.StreamAccessLogsMessage
	for b := 0; b < batches; b++ {
		forged = append(forged, forgedFailures(victim, perBatch, b))
	}
	extMetrics := "http://" + s.extHTTP + "/metrics"
	for name, token := range map[string]string{"no token": "", "a wrong token": "0123456789abcdef0123456789abcdef"} {
		if err := sendAccessLogs(t, s.extGRPC, token, forged); status.Code(err) != codes.Unauthenticated {
			t.Errorf("access logs with %s: %v, want Unauthenticated", name, err)
		}
	}
	if n, err := metric(extMetrics, "inferlb_extproc_auth_failures_total", `method="/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"`); err != nil || n < 2 {
		t.Errorf("refused access-log streams counted: %v (%v), want ≥ 2", n, err)
	}
	// With the token: ids ext_proc never issued are no evidence.
	if err := sendAccessLogs(t, s.extGRPC, s.auth.extToken, forged); err != nil {
		t.Errorf("access logs with the token: %v", err)
	}
	if err := envoytest.Poll(context.Background(), 10*time.Second, 50*time.Millisecond, func() error {
		n, err := metric(extMetrics, "inferlb_extproc_unknown_request_logs_total", `log="upstream"`)
		if err == nil && n < batches*perBatch {
			err = fmt.Errorf("%v of %d forged entries counted as unknown", n, batches*perBatch)
		}
		return err
	}); err != nil {
		t.Error(err)
	}

	// Several control cycles (1 s) and reports (250 ms) later.
	forgedAt := time.Now()
	tr.waitSent(t, tr.sentCount()+30, 30*time.Second)
	tally := tr.stop()
	t.Logf("traffic: %s", tally)
	if tally.all.ok != tally.sent {
		t.Errorf("requests failed: %s", tally)
	}
	views, err := s.cycleView(0)
	if err != nil {
		t.Fatal(err)
	}
	if v := views["e0"]; v.Penalty > 0 || v.ErrorRate > 0 {
		t.Errorf("forged access logs penalized e0: penalty %.2f, error rate %.2f (%s)", v.Penalty, v.ErrorRate, v.PenaltyWhy)
	}
	shares, err := s.envoyShares()
	if err != nil {
		t.Fatal(err)
	}
	if shares["e0"] < 0.15 {
		t.Errorf("e0's share in Envoy %.3f after forged access logs, want ≥ 0.15 (3 equal engines): %v", shares["e0"], shares)
	}
	t.Logf("%d forged failures at e0 (%d refused streams, then with the token), %.1f s later: e0 penalty %.2f, Envoy shares %v",
		batches*perBatch, 2, time.Since(forgedAt).Seconds(), views["e0"].Penalty, shares)
}
