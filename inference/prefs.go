package inference

import (
	"strings"
	"time"
)

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

// MaxTimeout bounds a request's time limit (Prefs.Timeout): an hour is far beyond any
// generation this mesh serves (4096 tokens at a few tokens a second), so a longer one is a
// mistake in its unit rather than a wish.
const MaxTimeout = time.Hour

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
	// Timeout is the request's time limit, counted from when the API accepted it: the
	// request's context gets that deadline, the router counts it as the time a moved
	// generation has left (mesh/route's gate), and a request still running at its end ends
	// with timeout. 0: none. At most MaxTimeout. The API reads it as a Go duration string
	// (ParseTimeout), so it has no JSON form of its own here.
	Timeout time.Duration `json:"-"`
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
	if p.Timeout == 0 {
		p.Timeout = d.Timeout
	}
	return p
}

// Validate reports an unknown value, or a timeout below 0 or over MaxTimeout, as
// invalid_request naming the accepted ones. Empty fields are valid (not given).
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
	if err := checkEnum("transport", string(p.Transport), TransportLibp2p, TransportWebRTC); err != nil {
		return err
	}
	if p.Timeout < 0 || p.Timeout > MaxTimeout {
		return invalid("timeout %s is not %s", p.Timeout, timeoutForm)
	}
	return nil
}

// TimeLimitPassed is the error a request ends with when its time limit (Prefs.Timeout)
// passed: code timeout, the message naming the limit.
func TimeLimitPassed(limit time.Duration) *Error {
	return Errorf(CodeTimeout, "the request's %s time limit passed", limit)
}

// timeoutForm is the accepted form of a timeout, as error messages name it (MaxTimeout).
const timeoutForm = "a duration such as 30s or 2m, at most 1h"

// ParseTimeout reads a timeout preference as the API receives it: a Go duration
// (time.ParseDuration: "30s", "2m", "1m30s"), positive and at most MaxTimeout. "" is not
// given (0). Anything else, a bare number of seconds included, is an invalid_request naming
// the accepted form: one form, no guessing at units.
func ParseTimeout(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > MaxTimeout {
		if len(s) > 64 {
			s = s[:64] + "…"
		}
		return 0, invalid("timeout %q is not %s", s, timeoutForm)
	}
	return d, nil
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
