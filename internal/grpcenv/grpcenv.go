// Package grpcenv sets gRPC-Go's environment-only settings for the inferlb
// binary before gRPC reads them: gRPC reads them into package variables
// when it is initialized, and Go initializes packages in the order of
// their import paths among those whose imports are ready, so this package
// (github.com/..., importing only os) is initialized before
// google.golang.org/grpc/internal/envconfig. A value set in the
// environment is left alone.
//
// GRPC_GO_EXPERIMENTAL_HTTP_FRAMER_READ_BUFFER_POOLING=false: since
// gRPC-Go 1.8x each connection's reads wait for readiness and take a
// pooled buffer per read, so that idle connections pin no read buffer. The
// ext_proc service has a handful of busy connections (one per Envoy
// worker) and pays that on every message: with it off, its CPU per 8 KB
// decision at one request at a time was 0.74–0.89× (three interleaved
// pairs of `inferlb bench extproc`), for 32 KiB of read buffer per
// connection.
package grpcenv

import "os"

func init() {
	const readPooling = "GRPC_GO_EXPERIMENTAL_HTTP_FRAMER_READ_BUFFER_POOLING"
	if _, set := os.LookupEnv(readPooling); !set {
		_ = os.Setenv(readPooling, "false")
	}
}
