package route

import (
	"fmt"
	"math"
	"time"
)

// The viability gate: how a running generation moves when its target goes (issue 17).
//
// A generation is cut when the peer (or a stage of the pipeline) serving it leaves: killed,
// paused, timing out. Four ways go on from there, keeping less and less of what was done:
//
//	live_transfer  the leaving node is still up (it leaves with notice: a participation
//	               pause, SIGTERM with drain) and sends its session's KV state to the
//	               replacement, which goes on decoding from it
//	replay         the replacement rebuilds the state from what the requester holds: the
//	               prompt and the tokens generated so far, prefilled as one batch
//	restart_peer   the replacement generates the completion again from the prompt, and the
//	               tokens the client has already had are skipped (deterministic models only:
//	               another run must give them again, token for token)
//	restart_cloud  the cloud tier generates the completion again
//
// Gate picks one from measured figures, as a pure function like Decide: it reads no clock
// and keeps no state.
//
// # Estimates
//
// Each option's estimate is the time from the decision to the completion's last token, with
// ctx = prompt + generated tokens, rest = the tokens still to generate, and the
// replacement's prefill and decode rates (DefaultGatePrefillRate, DefaultTokensPerSec when
// not measured):
//
//	live_transfer  RTT + cold + KV bytes ÷ bandwidth + rest ÷ decode
//	replay         RTT + cold + ctx ÷ prefill + rest ÷ decode
//	restart_peer   RTT + cold + prompt ÷ prefill + (generated + rest) ÷ decode
//	restart_cloud  cloud TTFT + (generated + rest) ÷ cloud tokens/s
//
// where cold is the replacement's time to load the model (0 when it is warm there).
//
// Live transfer is counted as if the stream stopped for the whole copy, though the leaving
// node keeps decoding during its pre-copy: the estimate is high by at most the tokens it
// decodes meanwhile, so the gate never picks a live transfer on an optimistic guess. A live
// transfer needs a measured bandwidth (GateInput.Bandwidth): never a guessed one, which is
// the point of measuring it (the caller probes first when no recent sample exists). The
// cloud's TTFT and rate are the measured ones (the executor's: its TTFT by prompt length,
// its rate by context, DecodeFit), else the defaults Decide uses (DefaultCloudTTFT,
// DefaultTokensPerSec).
//
// # The rule
//
//  1. The options possible: live_transfer when the source is up, a replacement exists and
//     the bandwidth to it is measured; replay and restart_peer when a replacement exists
//     (restart_peer only for a deterministic model); restart_cloud when the request's
//     privacy allows the cloud and the node has one.
//  2. The best move is the possible migration (live_transfer, replay, restart_peer) with the
//     lowest estimate; on equal estimates the one that keeps more (live_transfer, then
//     replay).
//  3. With the cloud possible, the generation moves to the cloud at once, no migration
//     attempted, when no migration is strictly faster than the cloud restart, or when the
//     best one's move would take more than MaxMoveBudgetShare of the remaining budget (the
//     request's deadline, GateInput.Budget; 0 is none): a move that eats most of what is
//     left has no room for its own failure. A move is the part of a migration's estimate
//     before the stream goes on with new tokens (GateDecision.Moves): moving the KV state,
//     or rebuilding it by prefill (and, for restart_peer, decoding the tokens sent again);
//     the tokens still to generate take their time wherever they are generated.
//  4. Without the cloud, the best migration is taken, even one that may not end within the
//     budget (rest is the completion budget left, an upper bound: the model may stop
//     sooner, and ending the request now is no better than trying); when no migration is
//     possible the choice is none and the caller ends the request with the cut's error.
type MoveOption string

// The gate's choices (GateDecision.Choice). The names are those of /api/status.migration.
const (
	MoveLiveTransfer MoveOption = "live_transfer"
	MoveReplay       MoveOption = "replay"
	MoveRestartPeer  MoveOption = "restart_peer"
	MoveRestartCloud MoveOption = "restart_cloud"
	MoveNone         MoveOption = "none"
)

const (
	// MaxMoveBudgetShare is the share of the remaining budget (0.5) past which a migration
	// is not attempted when the cloud can take over: half is left for the migration to fail
	// and the cloud to start over.
	MaxMoveBudgetShare = 0.5
	// DefaultGatePrefillRate (500 tokens/s) is a replacement's prefill rate when none is
	// measured: ten times DefaultTokensPerSec, a batch being that much faster a token than
	// decoding on the CPUs a mesh is made of.
	DefaultGatePrefillRate = 10 * DefaultTokensPerSec
)

// GateInput is what the gate knows of a cut generation, its replacement and the cloud. Rates
// are per second; 0 (or less) is not measured.
type GateInput struct {
	// PromptTokens, Generated and Remaining are the prompt's tokens, the tokens generated
	// (and sent to the client) so far and those still to generate (the completion budget
	// left).
	PromptTokens, Generated, Remaining int
	// Deterministic: another run of the model gives the same tokens (restart_peer possible).
	Deterministic bool
	// SourceUp: the node that served the session is still up and can send its state.
	SourceUp bool
	// KVBytes is the session's KV state to move (bytes).
	KVBytes int64

	// Replacement: a peer (or pipeline) can take the session. The fields below describe it.
	Replacement bool
	// Bandwidth is the measured bandwidth from the source to the replacement (bytes/s).
	Bandwidth float64
	// RTT is the measured round trip to the replacement.
	RTT time.Duration
	// PrefillRate and DecodeRate are the replacement's measured rates (tokens/s): its
	// prefill of the session's positions (PrefillFit), its decode of the tokens still to
	// come, at their context (DecodeFit).
	PrefillRate, DecodeRate float64
	// ColdStart is the replacement's time to load the model; 0 when it is warm there.
	ColdStart time.Duration

	// Cloud: the request's privacy allows the cloud tier and this node has one.
	Cloud bool
	// CloudTTFT and CloudRate are the cloud's measured time to first token and rate (of
	// the tokens a restart decodes, at their context, once measured).
	CloudTTFT time.Duration
	CloudRate float64
	// CloudTTFTPerToken is the cloud's measured time to first token per prompt token
	// (seconds): a restart there processes the whole prompt again, and a time to first
	// token measured on short prompts says little of a long one's. The restart's first
	// token is estimated at the larger of CloudTTFT and this × PromptTokens.
	CloudTTFTPerToken float64

	// Budget is the time left before the request's deadline; 0 (or less) is none.
	Budget time.Duration
}

// GateDecision is the gate's choice, its estimate, and every option's estimate (0: not
// possible) for status and for comparing with what the move really took.
type GateDecision struct {
	Choice   MoveOption
	Estimate time.Duration
	// Options are the estimates of live_transfer, replay, restart_peer, restart_cloud, in
	// that order; 0 for an option that is not possible.
	Options [4]time.Duration
	// Moves are the moves of live_transfer, replay and restart_peer (rule 3): each
	// Options' part before the stream goes on; 0 for an option that is not possible.
	Moves [3]time.Duration
	// Why says in words why Choice, for logs and status.
	Why string
}

// Possible returns the estimate of each option possible (those Options holds above 0).
func (d GateDecision) Possible() map[MoveOption]time.Duration {
	out := make(map[MoveOption]time.Duration, len(d.Options))
	for i, est := range d.Options {
		if est > 0 {
			out[gateOrder[i]] = est
		}
	}
	return out
}

// gateOrder is GateDecision.Options's order.
var gateOrder = [4]MoveOption{MoveLiveTransfer, MoveReplay, MoveRestartPeer, MoveRestartCloud}

// Gate decides how a cut generation goes on: see "The rule" above.
func Gate(in GateInput) GateDecision {
	prefill := rateOr(in.PrefillRate, DefaultGatePrefillRate)
	decode := rateOr(in.DecodeRate, DefaultTokensPerSec)
	// The round trip and cold start before the replacement's first token, each capped as
	// Decide caps them, so that no estimate overflows (possible).
	rtt := min(max(in.RTT, 0), maxEstimate) + min(max(in.ColdStart, 0), maxEstimate)
	prompt, gen, rest := max(in.PromptTokens, 0), max(in.Generated, 0), max(in.Remaining, 0)

	var d GateDecision
	if in.Replacement {
		if in.SourceUp && in.Bandwidth > 0 {
			d.Moves[0] = possible(rtt + perRate(float64(max(in.KVBytes, 0)), in.Bandwidth))
		}
		d.Moves[1] = possible(rtt + perRate(float64(prompt+gen), prefill))
		if in.Deterministic {
			d.Moves[2] = possible(rtt + perRate(float64(prompt), prefill) + perRate(float64(gen), decode))
		}
		for i, mv := range d.Moves {
			if mv > 0 {
				d.Options[i] = mv + perRate(float64(rest), decode)
			}
		}
	}
	if in.Cloud {
		ttft := in.CloudTTFT
		if ttft <= 0 {
			ttft = DefaultCloudTTFT
		}
		if in.CloudTTFTPerToken > 0 {
			ttft = max(ttft, perRate(float64(prompt), 1/in.CloudTTFTPerToken))
		}
		d.Options[3] = possible(min(ttft, maxEstimate) + perRate(float64(gen+rest), rateOr(in.CloudRate, DefaultTokensPerSec)))
	}

	best := -1 // the best migration, if any
	for i := range 3 {
		if d.Options[i] > 0 && (best < 0 || d.Options[i] < d.Options[best]) {
			best = i
		}
	}
	cloud := d.Options[3]
	switch {
	case in.Cloud && best < 0:
		d.Choice, d.Estimate, d.Why = MoveRestartCloud, cloud, "no peer can take the session"
	case in.Cloud && d.Options[best] >= cloud:
		d.Choice, d.Estimate = MoveRestartCloud, cloud
		d.Why = fmt.Sprintf("%s (%v) is not faster than a cloud restart (%v)", gateOrder[best], d.Options[best], cloud)
	case in.Cloud && in.Budget > 0 && float64(d.Moves[best]) > MaxMoveBudgetShare*float64(in.Budget):
		d.Choice, d.Estimate = MoveRestartCloud, cloud
		d.Why = fmt.Sprintf("%s's move (%v) would take over %.0f %% of the %v left", gateOrder[best], d.Moves[best], 100*MaxMoveBudgetShare, in.Budget)
	case best < 0:
		d.Choice, d.Why = MoveNone, "no peer can take the session and the cloud is not allowed"
	default:
		d.Choice, d.Estimate = gateOrder[best], d.Options[best]
		d.Why = fmt.Sprintf("%s is the fastest way on (%v)", gateOrder[best], d.Options[best])
		if in.Cloud {
			d.Why += fmt.Sprintf(", faster than a cloud restart (%v)", cloud)
		}
	}
	return d
}

// rateOr is r when measured (> 0 and finite), else def.
func rateOr(r, def float64) float64 {
	if r > 0 && !math.IsInf(r, 0) && !math.IsNaN(r) {
		return r
	}
	return def
}

// perRate is the time to move n units at rate units a second, capped at maxEstimate (24 h).
func perRate(n, rate float64) time.Duration {
	if n <= 0 {
		return 0
	}
	return time.Duration(min(n/rate, maxEstimate.Seconds()) * float64(time.Second))
}

// possible is the estimate of a possible option: at least 1 ns, since 0 means not possible.
// d is at most 4 × maxEstimate (four capped terms), far from overflow.
func possible(d time.Duration) time.Duration { return max(d, time.Nanosecond) }
