package participation

import "time"

// Hysteresis defaults. The package doc shows what they mean at the default heartbeat.
const (
	// DefaultHeartbeat is the node's heartbeat (15 s): how often it re-reads the sensors
	// and re-announces, and so the unit of the hysteresis below.
	DefaultHeartbeat = 15 * time.Second

	// DefaultRecoverBeats is how many consecutive healthy observations resume a paused node
	// (3 heartbeats): a reading hovering at a threshold rarely stays on the good side three
	// times running, and 30 s between the first healthy reading and the resume is short
	// next to the time a battery takes to drain or charge across a threshold.
	DefaultRecoverBeats = 3

	// BackoffHeartbeats is the default backoff window in heartbeats (8, two minutes at
	// 15 s): at most one pause→resume cycle per window, so a node that flaps anyway costs
	// its peers at most one failed-over dispatch per two minutes.
	BackoffHeartbeats = 8
)

// Params are the Governor's hysteresis.
type Params struct {
	// RecoverBeats is how many consecutive observations without a breach take a paused node
	// back to accepting (observations, at least 1).
	RecoverBeats int
	// BackoffWindow is the least time between two resumes (at least 0): at most one
	// pause→resume cycle per window.
	BackoffWindow time.Duration
}

// DefaultParams returns DefaultRecoverBeats and a backoff window of BackoffHeartbeats
// heartbeats. A heartbeat of 0 or less means DefaultHeartbeat.
func DefaultParams(heartbeat time.Duration) Params {
	if heartbeat <= 0 {
		heartbeat = DefaultHeartbeat
	}
	return Params{
		RecoverBeats:  DefaultRecoverBeats,
		BackoffWindow: BackoffHeartbeats * heartbeat,
	}
}

// State is the Governor's admission state.
type State struct {
	// Accepting is true when the node takes new tasks from the mesh.
	Accepting bool `json:"accepting"`
	// Reasons is empty when accepting. When paused it lists the current breaches, or, when
	// the latest observation had none and the node is waiting out its recovery, the breaches
	// of the latest observation that had some.
	Reasons []Reason `json:"reasons"`
	// Since is when the current state began: the observation that paused or resumed the
	// node (zero before the first observation).
	Since time.Time `json:"since"`
	// HealthyBeats counts the consecutive observations without a breach up to now.
	HealthyBeats int `json:"healthy_beats"`
}

// Governor turns a stream of observations into an admission state with hysteresis: any
// breach pauses at once; a paused node resumes only after RecoverBeats consecutive healthy
// observations and at least BackoffWindow after its previous resume. It starts paused with
// sensors_silent until its first observation, which, if healthy, resumes at once: there is
// no history to smooth yet.
//
// A Governor is not safe for concurrent use; its owner holds a lock around it.
type Governor struct {
	params    Params
	observed  bool      // an observation has happened
	accepting bool      // admission state
	reasons   []Reason  // State.Reasons while paused
	pausedFor []Reason  // breaches of the latest observation that had some
	since     time.Time // start of the current state
	healthy   int       // consecutive observations without a breach
	resumed   bool      // lastResume is set
	// lastResume is the latest recovery from a breach (the first observation's resume does
	// not count: nothing was breached before it).
	lastResume time.Time
}

// NewGovernor returns a paused Governor (reason sensors_silent). A RecoverBeats below 1
// counts as 1 and a negative BackoffWindow as 0.
func NewGovernor(p Params) *Governor {
	p.RecoverBeats = max(p.RecoverBeats, 1)
	p.BackoffWindow = max(p.BackoffWindow, 0)
	silent := []Reason{ReasonSensorsSilent}
	return &Governor{params: p, reasons: silent, pausedFor: silent}
}

// Observe applies policy p to the conditions read at now and returns the new state.
// consented is as for Breaches. Call it once per heartbeat, and at once when the policy or
// the consent changes (withdrawing consent or switching to profile off pauses immediately).
// A clock that goes backwards only delays a resume. It judges no traffic cap: a node that
// counts its traffic calls ObserveTraffic instead.
func (g *Governor) Observe(p Policy, c Conditions, consented bool, now time.Time) State {
	return g.Step(Breaches(p, c, consented), now)
}

// ObserveTraffic is Observe that also applies p's traffic cap to lastHour, the bytes of mesh
// traffic of the last hour (a TrafficMeter's Total at now): its breaches are Breaches'
// followed by TrafficBreaches'. The node calls it every heartbeat, and when an admission
// finds the cap reached, so that the node pauses at once.
func (g *Governor) ObserveTraffic(p Policy, c Conditions, consented bool, lastHour int64, now time.Time) State {
	return g.Step(append(Breaches(p, c, consented), TrafficBreaches(p, lastHour)...), now)
}

// Step applies one observation, made at now, whose breaches are br (none: healthy), and
// returns the new state. Observe and ObserveTraffic are Step with the breaches they find.
func (g *Governor) Step(br []Reason, now time.Time) State {
	first := !g.observed
	g.observed = true
	if len(br) > 0 {
		if g.accepting || first {
			g.since = now
		}
		g.accepting, g.healthy = false, 0
		br = append([]Reason(nil), br...) // the caller's slice stays the caller's
		g.reasons, g.pausedFor = br, br
		return g.State()
	}
	g.healthy++
	if g.accepting {
		return g.State()
	}
	switch {
	case first:
	case g.healthy < g.params.RecoverBeats:
		g.reasons = g.pausedFor
		return g.State()
	case g.resumed && now.Sub(g.lastResume) < g.params.BackoffWindow:
		g.reasons = g.pausedFor
		return g.State()
	default:
		g.resumed, g.lastResume = true, now
	}
	g.accepting, g.since, g.reasons = true, now, nil
	return g.State()
}

// State returns the current state. Its Reasons are a copy.
func (g *Governor) State() State {
	return State{
		Accepting:    g.accepting,
		Reasons:      append([]Reason{}, g.reasons...), // never nil: status shows []
		Since:        g.since,
		HealthyBeats: g.healthy,
	}
}
