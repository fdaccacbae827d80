package inference

import "strings"

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
}

// Route is the edge form of where s was served: "local", "peer:<peer ID>", "cloud", or ""
// before any attempt.
func (s Served) Route() string {
	if s.Tier == TierMesh {
		return peerRoutePrefix + s.Peer
	}
	return string(s.Tier)
}

// ParseRoute reads a route string back (Route's inverse), as found in a meter event or a
// header. ok is false for anything else, "" included.
func ParseRoute(route string) (s Served, ok bool) {
	switch {
	case route == string(TierLocal), route == string(TierCloud):
		return Served{Tier: Tier(route)}, true
	case strings.HasPrefix(route, peerRoutePrefix) && len(route) > len(peerRoutePrefix):
		return Served{Tier: TierMesh, Peer: route[len(peerRoutePrefix):]}, true
	}
	return Served{}, false
}
