package inference

import (
	"fmt"
	"strings"
)

// Tier is where a request runs.
type Tier string

// Tiers, in the order that wins ties when routing.
const (
	TierLocal Tier = "local" // this node's own backend
	TierMesh  Tier = "mesh"  // a peer in the mesh
	TierCloud Tier = "cloud" // the configured cloud API
)

// peerRoutePrefix starts the route string of a mesh target: "peer:<peer ID>".
const peerRoutePrefix = "peer:"

// Served says where a request is or was served. The executor fills it in; the API, the
// gateway, metering and `meshinfer status` read its fields. Its string form (Route) exists
// only at the edges: the X-Meshinfer-Route header, the meshinfer object of a response, the
// meter's JSON lines and logs.
type Served struct {
	// Tier is the tier of the latest attempt; "" before any attempt.
	Tier Tier
	// Peer is the serving peer's ID (its string form), for TierMesh only.
	Peer string
	// Transport is how this node reached the peer (TierMesh only); "" when not known.
	Transport Transport
	// Attempts counts the targets tried so far, this one included (a resumption is an
	// attempt).
	Attempts int
	// Model is the model serving the request when the router chose it (route auto); ""
	// means the request's own.
	Model string
	// Stages are the pipeline that served the request (TierMesh), in chain order, when no
	// single peer holds the model: Peer is then empty.
	Stages []StageHop
}

// StageHop is one stage of a pipeline: a peer (its string form) holding layers [Lo, Hi).
type StageHop struct {
	Peer   string
	Lo, Hi int
}

// Route is the edge form of where s was served: "local", "peer:<peer ID>", "cloud",
// "pipeline:<peer>[0-7],<peer>[8-15]" (each stage's peer and its layers, first to last,
// inclusive), or "" before any attempt.
func (s Served) Route() string {
	switch {
	case s.Tier == TierMesh && len(s.Stages) > 0:
		var b strings.Builder
		b.WriteString(pipelineRoutePrefix)
		for i, st := range s.Stages {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s[%d-%d]", st.Peer, st.Lo, st.Hi-1)
		}
		return b.String()
	case s.Tier == TierMesh:
		return peerRoutePrefix + s.Peer
	}
	return string(s.Tier)
}

// pipelineRoutePrefix starts the route of a pipeline.
const pipelineRoutePrefix = "pipeline:"

// ParseRoute reads a route string back (Route's inverse), as found in a meter event or a
// header. ok is false for anything else, "" included.
func ParseRoute(route string) (s Served, ok bool) {
	switch {
	case route == string(TierLocal), route == string(TierCloud):
		return Served{Tier: Tier(route)}, true
	case strings.HasPrefix(route, peerRoutePrefix) && len(route) > len(peerRoutePrefix):
		return Served{Tier: TierMesh, Peer: route[len(peerRoutePrefix):]}, true
	case strings.HasPrefix(route, pipelineRoutePrefix) && len(route) > len(pipelineRoutePrefix):
		var stages []StageHop
		for part := range strings.SplitSeq(route[len(pipelineRoutePrefix):], ",") {
			open := strings.IndexByte(part, '[')
			var lo, hi int
			if open <= 0 || !strings.HasSuffix(part, "]") {
				return Served{}, false
			}
			if n, err := fmt.Sscanf(part[open:], "[%d-%d]", &lo, &hi); n != 2 || err != nil || lo < 0 || hi < lo {
				return Served{}, false
			}
			stages = append(stages, StageHop{Peer: part[:open], Lo: lo, Hi: hi + 1})
		}
		return Served{Tier: TierMesh, Stages: stages}, true
	}
	return Served{}, false
}
