package envoyrun

import (
	"fmt"
	"net"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// Host is one endpoint as Envoy's /clusters shows it.
type Host struct {
	Address  string // ip:port
	Hostname string
	Weight   uint32
	Priority uint32
	// EDSHealth is the health status the control plane sent.
	EDSHealth string
	// FailedActiveHC and FailedOutlier are Envoy's own verdicts.
	FailedActiveHC bool
	FailedOutlier  bool
	PendingHC      bool
}

// Routable says whether Envoy would send traffic to the host.
func (h Host) Routable() bool {
	return !h.FailedActiveHC && !h.FailedOutlier && (h.EDSHealth == "HEALTHY" || h.EDSHealth == "UNKNOWN")
}

// Clusters reads /clusters?format=json: cluster name → address → host.
func (e *Envoy) Clusters() (map[string]map[string]Host, error) {
	b, err := e.Admin("/clusters?format=json")
	if err != nil {
		return nil, err
	}
	var cs adminv3.Clusters
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &cs); err != nil {
		return nil, fmt.Errorf("parse /clusters: %w", err)
	}
	out := map[string]map[string]Host{}
	for _, c := range cs.ClusterStatuses {
		hosts := map[string]Host{}
		for _, h := range c.HostStatuses {
			sa := h.GetAddress().GetSocketAddress()
			addr := net.JoinHostPort(sa.GetAddress(), fmt.Sprint(sa.GetPortValue()))
			hs := h.GetHealthStatus()
			hosts[addr] = Host{
				Address: addr, Hostname: h.Hostname, Weight: h.Weight, Priority: h.Priority,
				EDSHealth:      hs.GetEdsHealthStatus().String(),
				FailedActiveHC: hs.GetFailedActiveHealthCheck(),
				FailedOutlier:  hs.GetFailedOutlierCheck(),
				PendingHC:      hs.GetPendingActiveHc(),
			}
		}
		out[c.Name] = hosts
	}
	return out, nil
}
