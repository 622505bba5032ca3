package server

import (
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"
)

// parkNACKed decorates the snapshot cache so that a rejected update is not
// sent again. A state-of-the-world NACK carries the last version Envoy
// accepted; the snapshot cache, seeing it differ from the version it
// holds, would answer at once with the update Envoy just rejected, and
// Envoy would reject it again, in a loop of thousands a second. So the
// watch of a NACK is opened at the rejected version instead: the cache
// parks it until a different version is set (the next Publish), and a
// rejected update is sent once per stream.
//
// Delta watches pass through: the delta server tracks the versions it sent,
// not the ones Envoy accepted, and does not resend. Fetch passes through.
type parkNACKed struct {
	cachev3.Cache
}

// CreateWatch implements cachev3.ConfigWatcher.
func (c parkNACKed) CreateWatch(r *cachev3.Request, sub cachev3.Subscription, out chan cachev3.Response) (func(), error) {
	if r.GetErrorDetail() != nil {
		if v, ok := rejectedVersion(sub); ok && v != r.GetVersionInfo() {
			// The server owns r (and hands it to callbacks): park a copy.
			parked := proto.Clone(r).(*cachev3.Request)
			parked.VersionInfo = v
			r = parked
		}
	}
	return c.Cache.CreateWatch(r, sub, out)
}

// rejectedVersion is the version of the response a NACK rejects: the
// server records, per stream and type, the resources it last sent with the
// version they were sent in (one version per state-of-the-world response).
// With nothing recorded, or versions that disagree, there is no telling,
// and the watch is not parked.
func rejectedVersion(sub cachev3.Subscription) (string, bool) {
	v, ok := "", false
	for _, rv := range sub.ReturnedResources() {
		if ok && rv != v {
			return "", false
		}
		v, ok = rv, true
	}
	return v, ok && v != ""
}
