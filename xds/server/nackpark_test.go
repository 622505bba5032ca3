package server

import (
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
)

// The rejected version is the one every returned resource was last sent
// in; without one agreed version the watch is not parked.
func TestRejectedVersion(t *testing.T) {
	for name, tc := range map[string]struct {
		returned map[string]string
		want     string
		ok       bool
	}{
		"one version":    {map[string]string{"a": "v2", "b": "v2"}, "v2", true},
		"nothing sent":   {map[string]string{}, "", false},
		"disagreeing":    {map[string]string{"a": "v1", "b": "v2"}, "", false},
		"empty versions": {map[string]string{"a": ""}, "", false},
	} {
		sub := stream.NewSotwSubscription([]string{"a", "b"}, false)
		sub.SetReturnedResources(tc.returned)
		if v, ok := rejectedVersion(&sub); v != tc.want || ok != tc.ok {
			t.Errorf("%s: got %q %v, want %q %v", name, v, ok, tc.want, tc.ok)
		}
	}
}
