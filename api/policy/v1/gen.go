// Package policyv1 holds the RoutingPolicy xDS resource and the Reports API
// between the control plane and the ext_proc services. The .pb.go files are
// generated from policy.proto and committed; regenerate with `go generate`
// (needs protoc, protoc-gen-go and protoc-gen-go-grpc on PATH).
package policyv1

//go:generate protoc -I . --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative policy.proto

// TypeURL is the xDS type URL of RoutingPolicy.
const TypeURL = "type.googleapis.com/inferlb.policy.v1.RoutingPolicy"
