package server_test

import (
	"context"
	"fmt"
	"runtime"
	"sort"
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

// BenchmarkFanout1000 publishes one allocation change to 1,000 ADS clients
// (Envoys of three frontend clusters, sharing three node ids) on loopback
// and measures the time until every client has the new EDS version. The
// clients run in this process, so the CPU figure includes their decoding
// and ACKs; heap-MB is the heap held with 1,000 streams open.
func BenchmarkFanout1000(b *testing.B) {
	const clients = 1000
	srv, addr := xdstest.StartServer(b, server.Config{})
	eng := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000", "10.0.0.5:8000", "10.0.0.6:8000",
		"10.0.0.7:8000", "10.0.0.8:8000", "10.0.0.9:8000", "10.0.0.10:8000", "10.0.0.11:8000", "10.0.0.12:8000"}
	nodes := []string{"fe-a", "fe-b", "fe-c"}
	publish := func(k int) []string {
		var versions []string
		for i, n := range nodes {
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
	publish(0)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ready sync.WaitGroup
	gots := make([]chan string, clients)
	// 50 connections, 20 streams each (Envoys would each have their own;
	// the server's per-stream work is the same).
	conns := make([]*grpc.ClientConn, 50)
	for i := range conns {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		conns[i] = c
	}
	for i := 0; i < clients; i++ {
		gots[i] = make(chan string, 4)
		ready.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = adsClient(ctx, conns[i%len(conns)], nodes[i%len(nodes)], gots[i], &ready)
		}()
	}
	ready.Wait()
	for _, g := range gots {
		<-g
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	var lat []time.Duration
	var cpu time.Duration
	b.ResetTimer()
	for k := 1; k <= b.N; k++ {
		c0 := cpuTime()
		t0 := time.Now()
		versions := publish(k)
		for i, g := range gots {
			want := versions[i%len(nodes)]
			for v := range g {
				if v == want {
					break
				}
			}
		}
		lat = append(lat, time.Since(t0))
		cpu += cpuTime() - c0
	}
	b.StopTimer()
	cancel()
	for _, c := range conns {
		c.Close()
	}
	wg.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "ms-all-1000-p50")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "ms-all-1000-p99")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/fanout")
	b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/(1<<20), "heap-MB-1000-streams")
	_ = fmt.Sprint
}
