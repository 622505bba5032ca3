package server_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inferlb/inferlb/xds/server"
	"github.com/inferlb/inferlb/xds/translate"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// adsClient plays one Envoy: an ADS stream subscribing to CDS then EDS,
// ACKing every response, and reporting each EDS version it accepts.
func adsClient(ctx context.Context, conn *grpc.ClientConn, node string, got chan<- string, ready *sync.WaitGroup) error {
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	n := &corev3.Node{Id: node}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: n, TypeUrl: resourcev3.ClusterType}); err != nil {
		return err
	}
	subscribed := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		ack := &discoveryv3.DiscoveryRequest{TypeUrl: resp.TypeUrl, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}
		switch resp.TypeUrl {
		case resourcev3.ClusterType:
			if !subscribed {
				names := []string{}
				for range resp.Resources {
					names = append(names, "inferlb_chat")
				}
				if err := stream.Send(ack); err != nil {
					return err
				}
				if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names}); err != nil {
					return err
				}
				subscribed = true
				continue
			}
		case resourcev3.EndpointType:
			if ready != nil {
				ready.Done()
				ready = nil
			}
			select {
			case got <- resp.VersionInfo:
			case <-ctx.Done():
				return nil
			}
		}
		if err := stream.Send(ack); err != nil {
			return err
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFanout1000 publishes one allocation change (three node
// snapshots: the Envoys of three frontend clusters share three node ids) to
// 1,000 ADS clients on loopback and measures the time until every client
// has received the new EDS version. The clients run in a child
// process (this test binary re-executed), so the CPU and memory figures are
// the control plane's alone: cpu-ms/fanout is this process's CPU time per
// change, heap-MB what 1,000 open streams cost it.
func BenchmarkFanout1000(b *testing.B) {
	const clients = 1000
	srv, addr := xdstest.StartServer(b, server.Config{})
	eng := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000", "10.0.0.5:8000", "10.0.0.6:8000",
		"10.0.0.7:8000", "10.0.0.8:8000", "10.0.0.9:8000", "10.0.0.10:8000", "10.0.0.11:8000", "10.0.0.12:8000"}
	publish := func(k int) []string {
		var versions []string
		for i, n := range fanoutNodes {
			shares := make([]float64, len(eng))
			for j := range shares {
				shares[j] = float64(1 + (j+i+k)%len(eng))
			}
			r, err := translate.Translate(node(n, "r", eng, shares), translate.DefaultOptions())
			if err != nil {
				b.Fatal(err)
			}
			if err := srv.Publish(context.Background(), r); err != nil {
				b.Fatal(err)
			}
			versions = append(versions, r.EndpointVersion)
		}
		return versions
	}
	first := publish(0)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	cmd := exec.Command(os.Args[0], "-test.run=^TestFanoutClients$", "-test.count=1")
	cmd.Env = append(os.Environ(), "INFERLB_FANOUT_ADDR="+addr, fmt.Sprintf("INFERLB_FANOUT_CLIENTS=%d", clients))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	lines := bufio.NewScanner(stdout)
	await := func(versions []string) {
		if _, err := fmt.Fprintln(stdin, strings.Join(versions, " ")); err != nil {
			b.Fatal(err)
		}
		for lines.Scan() {
			if lines.Text() == "done" {
				return
			}
		}
		b.Fatalf("fan-out client process ended: %v", lines.Err())
	}
	await(first)
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	var lat []time.Duration
	var cpu time.Duration
	b.ResetTimer()
	for k := 1; k <= b.N; k++ {
		c0 := cpuTime()
		t0 := time.Now()
		await(publish(k))
		lat = append(lat, time.Since(t0))
		cpu += cpuTime() - c0
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "ms-all-1000-p50")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "ms-all-1000-p99")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/fanout")
	b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/(1<<20), "heap-MB-1000-streams")
}

var fanoutNodes = []string{"fe-a", "fe-b", "fe-c"}

// TestFanoutClients is the client side of BenchmarkFanout1000, run in a
// child process; it does nothing in a normal test run.
func TestFanoutClients(t *testing.T) {
	addr := os.Getenv("INFERLB_FANOUT_ADDR")
	if addr == "" {
		return
	}
	n, _ := strconv.Atoi(os.Getenv("INFERLB_FANOUT_CLIENTS"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conns := make([]*grpc.ClientConn, 50)
	for i := range conns {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	gots := make([]chan string, n)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := 0; i < n; i++ {
		gots[i] = make(chan string, 8)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = adsClient(ctx, conns[i%len(conns)], fanoutNodes[i%len(fanoutNodes)], gots[i], nil)
		}()
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		want := strings.Fields(in.Text())
		for i, g := range gots {
			for v := range g {
				if v == want[i%len(fanoutNodes)] {
					break
				}
			}
		}
		fmt.Println("done")
	}
}
