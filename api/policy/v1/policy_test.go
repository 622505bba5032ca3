package policyv1

import (
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
)

// The xDS type URL the control plane serves and ext_proc subscribes to must
// be the one protobuf derives for the message, or Any-unpacking fails.
func TestTypeURLMatchesMessage(t *testing.T) {
	a, err := anypb.New(&RoutingPolicy{NodeId: "n"})
	if err != nil {
		t.Fatal(err)
	}
	if a.TypeUrl != TypeURL {
		t.Fatalf("TypeURL = %q, message packs as %q", TypeURL, a.TypeUrl)
	}
}
