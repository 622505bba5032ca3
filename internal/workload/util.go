package workload

import "bytes"

func trimSpace(b []byte) []byte { return bytes.TrimSpace(b) }

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }
