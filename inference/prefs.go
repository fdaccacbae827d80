package inference

import "strings"

// Privacy says where a request may be served.
type Privacy string

const (
	// PrivacyLocalOnly: this device only. The request never leaves the process; if the
	// local backend cannot serve it the answer is local_unavailable, never a fallback.
	PrivacyLocalOnly Privacy = "local-only"
	// PrivacyMesh: this device or a peer of the mesh, never the cloud.
	PrivacyMesh Privacy = "mesh"
	// PrivacyAny: the cloud tier too, when the node has one and its owner allows it.
	PrivacyAny Privacy = "any"
)

// Priority says what the router optimises when more than one tier can serve.
type Priority string

const (
	// PriorityCost: the cheapest tier that can serve; ties go local, then mesh, then cloud.
	PriorityCost Priority = "cost"
	// PriorityLatency: the tier with the shortest estimated completion time.
	PriorityLatency Priority = "latency"
	// PriorityBalanced: the shortest estimated completion time with the cost counted as
	// time (mesh/route documents the exchange rate).
	PriorityBalanced Priority = "balanced"
)

// RouteMode says whether the router may change the model.
type RouteMode string

const (
	// RouteAuto: the router picks the target and may pick the model too: the named one
	// when some tier can serve it, else the best model available (a request may name no
	// model, or "auto").
	RouteAuto RouteMode = "auto"
	// RouteExplicit: the request's model, and no other.
	RouteExplicit RouteMode = "explicit"
)

// Transport says how this node reaches the peer that serves a request.
type Transport string

const (
	// TransportLibp2p: a libp2p stream over the node's connection to the peer.
	TransportLibp2p Transport = "libp2p"
	// TransportWebRTC: a WebRTC data channel straight to the peer, set up over libp2p.
	// When it cannot be set up in time, or breaks before the first token, the request
	// continues over a libp2p stream.
	TransportWebRTC Transport = "webrtc"
)

// AutoModel is the model name that asks the router to choose (with RouteAuto).
const AutoModel = "auto"

// Prefs are a request's routing preferences. The API fills them from the request body's
// "meshinfer" object, then the X-Meshinfer-* headers, then the node's defaults; an empty
// field means "not given" until then.
type Prefs struct {
	Privacy   Privacy   `json:"privacy,omitempty"`
	Priority  Priority  `json:"priority,omitempty"`
	Route     RouteMode `json:"route,omitempty"`
	Transport Transport `json:"transport,omitempty"`
}

// DefaultPrefs are the defaults of a node that was given none: the mesh but not the cloud,
// balanced, explicit model choice, libp2p streams.
func DefaultPrefs() Prefs {
	return Prefs{Privacy: PrivacyMesh, Priority: PriorityBalanced, Route: RouteExplicit, Transport: TransportLibp2p}
}

// Or fills p's empty fields from d.
func (p Prefs) Or(d Prefs) Prefs {
	if p.Privacy == "" {
		p.Privacy = d.Privacy
	}
	if p.Priority == "" {
		p.Priority = d.Priority
	}
	if p.Route == "" {
		p.Route = d.Route
	}
	if p.Transport == "" {
		p.Transport = d.Transport
	}
	return p
}

// Validate reports an unknown value as invalid_request naming the accepted ones. Empty
// fields are valid (not given).
func (p Prefs) Validate() error {
	if err := checkEnum("privacy", string(p.Privacy), PrivacyLocalOnly, PrivacyMesh, PrivacyAny); err != nil {
		return err
	}
	if err := checkEnum("priority", string(p.Priority), PriorityCost, PriorityLatency, PriorityBalanced); err != nil {
		return err
	}
	if err := checkEnum("route", string(p.Route), RouteAuto, RouteExplicit); err != nil {
		return err
	}
	return checkEnum("transport", string(p.Transport), TransportLibp2p, TransportWebRTC)
}

func checkEnum[T ~string](field, v string, allowed ...T) error {
	if v == "" {
		return nil
	}
	names := make([]string, len(allowed))
	for i, a := range allowed {
		if string(a) == v {
			return nil
		}
		names[i] = string(a)
	}
	if len(v) > 64 {
		v = v[:64] + "…"
	}
	return invalid("%s %q is not one of %s", field, v, strings.Join(names, ", "))
}
