package reputation

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Score thresholds. They are fixed rather than tunable because the router, the console and
// the reliability scenarios (docs/reliability.md F2, F3, F6) all speak in these numbers.
const (
	// MinScore and MaxScore bound every node score (points).
	MinScore = 0.0
	MaxScore = 100.0

	// NeutralScore is the score of a peer we hold no evidence about (points). New peers start
	// here so they get traffic, but only half the weight of a proven peer.
	NeutralScore = 50.0

	// ExcludeBelow is the exclusion threshold (points): a peer scoring strictly below it is
	// removed from the candidate set before selection. Only integrity failures can get a peer
	// there; see Params.AvailabilityFloor.
	ExcludeBelow = 40.0

	// FullWeightScore is the score at and above which a peer gets selection weight 1.0
	// (points). Reaching it takes proven history, not just the absence of failures.
	FullWeightScore = 90.0

	// ProbationWeight is the selection weight at exactly ExcludeBelow (dimensionless). The
	// probation band [40, 50) ramps from here to NeutralWeight, so a peer on probation gets a
	// small share (about a fifth of a neutral peer's at 40) rather than none.
	ProbationWeight = 0.1

	// NeutralWeight is the selection weight at NeutralScore (dimensionless).
	NeutralWeight = 0.5
)

// Internal constants of the score model. None of them is a policy knob.
const (
	// decayToZero is the magnitude (points) under which an aged score counter becomes exactly
	// zero, so idle entries turn neutral and prunable in finite time (pubsub's DecayToZero).
	decayToZero = 0.01

	// penaltyClearFraction is the fraction of one failure's penalty under which a target's
	// residual penalty counts as cleared: 0.1 means four successes clear one failure at the
	// default SuccessPenaltyFactor of 0.5.
	penaltyClearFraction = 0.1

	// counterFloor bounds every negative score counter (points). Nothing below -MaxScore can
	// change a clamped score, and the bound keeps the recovery time after a flood finite.
	counterFloor = -MaxScore

	// maxStreak caps the consecutive-failure count (failures). Doubling 63 times overflows any
	// duration, so the cooldown reaches CooldownMax long before this matters.
	maxStreak = 63

	// perfSmoothing is the weight of one new performance sample in a peer's moving average
	// (dimensionless): about ten samples of memory, so a fixed peer converges within ten
	// requests. Stale history weighs even less; see RecordPerformance.
	perfSmoothing = 0.2

	// maxPerformanceRange bounds Params.PerformanceRange (log2 units): beyond 2^16 the factor
	// stops being a measurement and starts being noise.
	maxPerformanceRange = 16.0
)

// Default parameter values. Each states its unit and why it has this value.
const (
	// DefaultCooldownBase is the first cooldown after a retryable failure (2 s): at least one
	// dial timeout, so the next request does not land on a target whose dial may still hang.
	DefaultCooldownBase = 2 * time.Second

	// DefaultCooldownMax caps the exponential cooldown (10 s): after a partition heals,
	// routing must work again within 10 s (docs/reliability.md F2). Probing a dead target every
	// 10 s costs one failed dial, which is cheap.
	DefaultCooldownMax = 10 * time.Second

	// DefaultStreakReset is the quiet time after which the failure streak restarts (1 min):
	// a target that failed once an hour ago gets a first-failure cooldown, not a capped one.
	DefaultStreakReset = time.Minute

	// DefaultFailurePenalty is the local penalty per retryable failure (1 point): the unit
	// the other penalty parameters are expressed in.
	DefaultFailurePenalty = 1.0

	// DefaultPenaltyCap bounds a target's penalty (8 points, eight failures): more would only
	// lengthen recovery without changing the order.
	DefaultPenaltyCap = 8.0

	// DefaultPenaltyHalfLife ages a target's penalty (5 min): a target parked behind cleaner
	// ones and never retried still recovers in about 15 minutes.
	DefaultPenaltyHalfLife = 5 * time.Minute

	// DefaultSuccessPenaltyFactor multiplies the penalty on each success (0.5): four
	// successes clear one failure, "gradually" as the issue asks.
	DefaultSuccessPenaltyFactor = 0.5

	// DefaultSuccessWeight is the availability credit per success (+0.5 point): forty
	// successes within the half-life saturate SuccessCap.
	DefaultSuccessWeight = 0.5

	// DefaultSuccessCap caps availability credit (+20 points): a reliable peer at par
	// performance reaches 70 (weight 0.75); the rest of the way to 90 needs verification.
	DefaultSuccessCap = 20.0

	// DefaultFailureWeight is the availability debit per timeout or unavailable (-4 points):
	// three failures in a row take a neutral peer to the availability floor.
	DefaultFailureWeight = -4.0

	// DefaultHeartbeatMissedWeight is the debit per missed heartbeat (-2 points): weaker than
	// a failed request because a heartbeat can be lost on a healthy link.
	DefaultHeartbeatMissedWeight = -2.0

	// DefaultAvailabilityHalfLife ages availability credit and debit (10 min): an honest
	// peer recovers from a partition within about half an hour without an operator.
	DefaultAvailabilityHalfLife = 10 * time.Minute

	// DefaultAvailabilityFloor is the lowest score availability and performance can produce
	// (40 points, the exclusion threshold itself): a partition or a slow link never
	// excludes an honest peer (docs/reliability.md F2, F3); cooldowns handle it instead.
	DefaultAvailabilityFloor = ExcludeBelow

	// DefaultPerformanceWeight is the score swing of performance at saturation (±15 points).
	DefaultPerformanceWeight = 15.0

	// DefaultPerformanceRange is where the performance signal saturates (2, log2 units: four
	// times faster or slower than the reference). Also bounds the selection factor to
	// [1/4, 4].
	DefaultPerformanceRange = 2.0

	// DefaultPerformanceHalfLife ages confidence in a peer's performance (2 min): a peer that
	// got little traffic because it was slow drifts back to par and gets retried (the
	// stale-peer boost of docs/reliability.md F3).
	DefaultPerformanceHalfLife = 2 * time.Minute

	// DefaultPerformanceSamples is the sample count for full confidence (5 samples): one
	// slow request must not define a peer.
	DefaultPerformanceSamples = 5.0

	// DefaultVerifyPassedWeight is the integrity credit per passed verification (+1.5
	// points): ten passes saturate VerifyPassedCap.
	DefaultVerifyPassedWeight = 1.5

	// DefaultVerifyPassedCap caps integrity credit (+15 points).
	DefaultVerifyPassedCap = 15.0

	// DefaultVerifyFailedWeight is the debit per failed verification (-70 points): one
	// failure excludes even a perfect peer (100 - 70 = 30 < 40), which docs/reliability.md F6
	// assumes (a liar is out after its first sampled task).
	DefaultVerifyFailedWeight = -70.0

	// DefaultForgedWeight is the debit per forged announcement (-70 points): a forged
	// signature is never an accident, so it weighs like a failed verification.
	DefaultForgedWeight = -70.0

	// DefaultMalformedWeight is the debit per malformed frame or protocol violation (-10
	// points): a version skew or a buggy build can produce one, so one takes a neutral peer
	// to 40, two exclude.
	DefaultMalformedWeight = -10.0

	// DefaultIntegrityHalfLife ages integrity counters (12 h): sticky. A liar excluded by
	// one failed verification stays out for about a day and a half.
	DefaultIntegrityHalfLife = 12 * time.Hour

	// DefaultExploration is the share of selections spread uniformly over eligible
	// candidates (0.05, i.e. 5 %): enough to keep learning, small enough to be cheap.
	DefaultExploration = 0.05

	// DefaultMaxEntries caps health records and node scores, each (4096): comfortably above
	// the peers one node talks to, and a full store stays under about 3 MiB (roughly 300
	// bytes per record with its map slot and key).
	DefaultMaxEntries = 4096

	// DefaultRetain is how long an untouched node score is kept (1 h) before Prune forgets
	// it (docs/reliability.md F19), and with it the peer's untouched health records. Scores
	// carrying an integrity debit are kept until it decays.
	DefaultRetain = time.Hour

	// DefaultDecayInterval is the granularity of score ageing on reads (1 s): reads within
	// one tick reuse the aged counters and the cached score, which keeps a 1,000-candidate
	// decision cheap. It is 120 times shorter than the shortest default half-life, so a read
	// is at most 0.6 % stale.
	DefaultDecayInterval = time.Second
)

// ErrInvalidParams is wrapped by every error Validate returns.
var ErrInvalidParams = errors.New("invalid reputation params")

// Params tunes the store and selection. Build it with DefaultParams and change fields; New
// validates it once. Weights follow pubsub's convention: a field documented as a debit must
// be negative (or zero to disable), a credit positive (or zero).
type Params struct {
	// Target health (process-local, per model and serving target).

	// CooldownBase is the cooldown after the first retryable failure in a streak (duration,
	// > 0). Each further failure in a row after a cooldown ended doubles it.
	CooldownBase time.Duration
	// CooldownMax caps the doubled cooldown (duration, >= CooldownBase).
	CooldownMax time.Duration
	// StreakReset is the quiet time after the last failure after which a new failure starts
	// a fresh streak (duration, >= CooldownMax).
	StreakReset time.Duration
	// FailurePenalty is the local penalty added per timeout or unavailable (points, > 0).
	// Targets are ordered by penalty, lowest first.
	FailurePenalty float64
	// PenaltyCap bounds a target's penalty (points, >= FailurePenalty).
	PenaltyCap float64
	// PenaltyHalfLife ages the penalty while nothing happens (duration, > 0).
	PenaltyHalfLife time.Duration
	// SuccessPenaltyFactor multiplies the penalty on each success (fraction, in [0, 1));
	// 0 clears it at once.
	SuccessPenaltyFactor float64

	// Node score: availability class.

	// SuccessWeight is the credit per successful request (points, >= 0).
	SuccessWeight float64
	// SuccessCap bounds the availability credit (points, >= 0).
	SuccessCap float64
	// FailureWeight is the debit per timeout or unavailable (points, <= 0).
	FailureWeight float64
	// HeartbeatMissedWeight is the debit per missed heartbeat (points, <= 0).
	HeartbeatMissedWeight float64
	// AvailabilityHalfLife ages availability credit and debit (duration, > 0).
	AvailabilityHalfLife time.Duration
	// AvailabilityFloor is the lowest score that availability and performance signals can
	// produce together (points, in [ExcludeBelow, NeutralScore]); only integrity debits go
	// below it.
	AvailabilityFloor float64

	// Node score: performance class.

	// PerformanceWeight is the score swing when the performance signal saturates (points,
	// >= 0): +PerformanceWeight when PerformanceRange faster than the reference.
	PerformanceWeight float64
	// PerformanceRange is where the signal saturates (log2 of the speed ratio, in
	// (0, 16]). It also bounds the selection factor to [2^-range, 2^range].
	PerformanceRange float64
	// PerformanceHalfLife ages confidence in a peer's measurements (duration, > 0).
	PerformanceHalfLife time.Duration
	// PerformanceSamples is the number of recent samples that gives full confidence
	// (samples, >= 1).
	PerformanceSamples float64

	// Node score: integrity class.

	// VerifyPassedWeight is the credit per passed verification (points, >= 0).
	VerifyPassedWeight float64
	// VerifyPassedCap bounds the integrity credit (points, >= 0).
	VerifyPassedCap float64
	// VerifyFailedWeight is the debit per failed verification (points, < 0); it must exclude
	// even a peer at the highest reachable score.
	VerifyFailedWeight float64
	// ForgedWeight is the debit per forged announcement (points, <= 0).
	ForgedWeight float64
	// MalformedWeight is the debit per malformed frame or protocol violation (points, <= 0).
	MalformedWeight float64
	// IntegrityHalfLife ages integrity credit and debit (duration, > 0). Long: failures stick.
	IntegrityHalfLife time.Duration

	// Selection.

	// Exploration is the share of selections spread uniformly over eligible candidates
	// (fraction, in [0, 1)).
	Exploration float64

	// Bounds and ageing.

	// MaxEntries caps the (model, target) health records and the node scores, each
	// (records, >= 1). Past the cap the least useful records are evicted.
	MaxEntries int
	// Retain is how long an untouched node score without integrity debit, and an untouched
	// health record not cooling, survive Prune (duration, >= 0): how long a peer that left
	// is remembered.
	Retain time.Duration
	// DecayInterval is the ageing granularity of node-score reads (duration, >= 0 and
	// shorter than every half-life): reads within one interval tick share one ageing and a
	// cached score. Events always age exactly. Zero ages on every read.
	DecayInterval time.Duration
}

// DefaultParams returns the documented defaults.
func DefaultParams() Params {
	return Params{
		CooldownBase:         DefaultCooldownBase,
		CooldownMax:          DefaultCooldownMax,
		StreakReset:          DefaultStreakReset,
		FailurePenalty:       DefaultFailurePenalty,
		PenaltyCap:           DefaultPenaltyCap,
		PenaltyHalfLife:      DefaultPenaltyHalfLife,
		SuccessPenaltyFactor: DefaultSuccessPenaltyFactor,

		SuccessWeight:         DefaultSuccessWeight,
		SuccessCap:            DefaultSuccessCap,
		FailureWeight:         DefaultFailureWeight,
		HeartbeatMissedWeight: DefaultHeartbeatMissedWeight,
		AvailabilityHalfLife:  DefaultAvailabilityHalfLife,
		AvailabilityFloor:     DefaultAvailabilityFloor,

		PerformanceWeight:   DefaultPerformanceWeight,
		PerformanceRange:    DefaultPerformanceRange,
		PerformanceHalfLife: DefaultPerformanceHalfLife,
		PerformanceSamples:  DefaultPerformanceSamples,

		VerifyPassedWeight: DefaultVerifyPassedWeight,
		VerifyPassedCap:    DefaultVerifyPassedCap,
		VerifyFailedWeight: DefaultVerifyFailedWeight,
		ForgedWeight:       DefaultForgedWeight,
		MalformedWeight:    DefaultMalformedWeight,
		IntegrityHalfLife:  DefaultIntegrityHalfLife,

		Exploration: DefaultExploration,

		MaxEntries:    DefaultMaxEntries,
		Retain:        DefaultRetain,
		DecayInterval: DefaultDecayInterval,
	}
}

// maxReachable is the highest raw score the parameters allow (points): neutral plus every
// credit at its cap.
func (p Params) maxReachable() float64 {
	return NeutralScore + p.SuccessCap + p.PerformanceWeight + p.VerifyPassedCap
}

// Validate reports every problem with p, each wrapping ErrInvalidParams. It rejects NaN,
// Inf, negative or zero durations where they make no sense, weights of the wrong sign, and
// thresholds that contradict each other.
func (p Params) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidParams}, args...)...))
	}

	floats := []struct {
		name string
		v    float64
	}{
		{"FailurePenalty", p.FailurePenalty},
		{"PenaltyCap", p.PenaltyCap},
		{"SuccessPenaltyFactor", p.SuccessPenaltyFactor},
		{"SuccessWeight", p.SuccessWeight},
		{"SuccessCap", p.SuccessCap},
		{"FailureWeight", p.FailureWeight},
		{"HeartbeatMissedWeight", p.HeartbeatMissedWeight},
		{"AvailabilityFloor", p.AvailabilityFloor},
		{"PerformanceWeight", p.PerformanceWeight},
		{"PerformanceRange", p.PerformanceRange},
		{"PerformanceSamples", p.PerformanceSamples},
		{"VerifyPassedWeight", p.VerifyPassedWeight},
		{"VerifyPassedCap", p.VerifyPassedCap},
		{"VerifyFailedWeight", p.VerifyFailedWeight},
		{"ForgedWeight", p.ForgedWeight},
		{"MalformedWeight", p.MalformedWeight},
		{"Exploration", p.Exploration},
	}
	finite := true
	for _, f := range floats {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			bad("%s is %v, must be finite", f.name, f.v)
			finite = false
		}
	}
	if !finite {
		// The range checks below would only repeat the NaN in confusing words.
		return errors.Join(errs...)
	}

	// Durations.
	if p.CooldownBase <= 0 {
		bad("CooldownBase %v must be positive", p.CooldownBase)
	}
	if p.CooldownMax < p.CooldownBase {
		bad("CooldownMax %v is below CooldownBase %v", p.CooldownMax, p.CooldownBase)
	}
	if p.StreakReset < p.CooldownMax {
		bad("StreakReset %v is below CooldownMax %v, so streaks would reset before the cap", p.StreakReset, p.CooldownMax)
	}
	halfLives := []struct {
		name string
		v    time.Duration
	}{
		{"PenaltyHalfLife", p.PenaltyHalfLife},
		{"AvailabilityHalfLife", p.AvailabilityHalfLife},
		{"PerformanceHalfLife", p.PerformanceHalfLife},
		{"IntegrityHalfLife", p.IntegrityHalfLife},
	}
	for _, h := range halfLives {
		if h.v <= 0 {
			bad("%s %v must be positive", h.name, h.v)
			continue
		}
		if p.DecayInterval >= h.v {
			bad("DecayInterval %v must be shorter than %s %v", p.DecayInterval, h.name, h.v)
		}
	}
	if p.Retain < 0 {
		bad("Retain %v must not be negative", p.Retain)
	}
	if p.DecayInterval < 0 {
		bad("DecayInterval %v must not be negative", p.DecayInterval)
	}

	// Target penalty.
	if p.FailurePenalty <= 0 {
		bad("FailurePenalty %v must be positive", p.FailurePenalty)
	}
	if p.PenaltyCap < p.FailurePenalty {
		bad("PenaltyCap %v is below FailurePenalty %v", p.PenaltyCap, p.FailurePenalty)
	}
	if p.SuccessPenaltyFactor < 0 || p.SuccessPenaltyFactor >= 1 {
		bad("SuccessPenaltyFactor %v must be in [0, 1)", p.SuccessPenaltyFactor)
	}

	// Signs of the score weights.
	credits := []struct {
		name string
		v    float64
	}{
		{"SuccessWeight", p.SuccessWeight},
		{"SuccessCap", p.SuccessCap},
		{"PerformanceWeight", p.PerformanceWeight},
		{"VerifyPassedWeight", p.VerifyPassedWeight},
		{"VerifyPassedCap", p.VerifyPassedCap},
	}
	for _, c := range credits {
		if c.v < 0 {
			bad("%s %v must be positive or zero", c.name, c.v)
		}
	}
	debits := []struct {
		name string
		v    float64
	}{
		{"FailureWeight", p.FailureWeight},
		{"HeartbeatMissedWeight", p.HeartbeatMissedWeight},
		{"ForgedWeight", p.ForgedWeight},
		{"MalformedWeight", p.MalformedWeight},
	}
	for _, d := range debits {
		if d.v > 0 {
			bad("%s %v must be negative or zero", d.name, d.v)
		}
	}
	if p.VerifyFailedWeight >= 0 {
		bad("VerifyFailedWeight %v must be negative", p.VerifyFailedWeight)
	}

	// Thresholds that must agree with each other.
	if p.AvailabilityFloor < ExcludeBelow || p.AvailabilityFloor > NeutralScore {
		bad("AvailabilityFloor %v must be in [%v, %v] so availability alone never excludes", p.AvailabilityFloor, ExcludeBelow, NeutralScore)
	}
	if p.PerformanceRange <= 0 || p.PerformanceRange > maxPerformanceRange {
		bad("PerformanceRange %v must be in (0, %v]", p.PerformanceRange, maxPerformanceRange)
	}
	if p.PerformanceSamples < 1 {
		bad("PerformanceSamples %v must be at least 1", p.PerformanceSamples)
	}
	if top := p.maxReachable(); top < FullWeightScore {
		bad("credits reach only %v, below FullWeightScore %v, so no peer could earn full weight", top, FullWeightScore)
	}
	if top := min(p.maxReachable(), MaxScore); top+p.VerifyFailedWeight >= ExcludeBelow {
		bad("VerifyFailedWeight %v leaves a peer at %v at or above ExcludeBelow %v, so a failed verification could not exclude", p.VerifyFailedWeight, top, ExcludeBelow)
	}
	if p.Exploration < 0 || p.Exploration >= 1 {
		bad("Exploration %v must be in [0, 1)", p.Exploration)
	}
	if p.MaxEntries < 1 {
		bad("MaxEntries %d must be at least 1", p.MaxEntries)
	}
	return errors.Join(errs...)
}
