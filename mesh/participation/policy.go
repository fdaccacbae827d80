package participation

import (
	"fmt"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// Policy is one set of participation thresholds: a deployer's profile with its overrides, the
// owner's settings, or the effective policy made of both by Stricter. The zero Policy is the
// loosest possible except for its thermal field: an empty ThermalMaxState is not a known state
// and allows nothing (see the package doc).
type Policy struct {
	// Off pauses mesh work whatever the conditions (reason profile_off).
	Off bool `json:"off"`
	// RequireCharging pauses mesh work while a battery is present and not charging.
	RequireCharging bool `json:"require_charging"`
	// BatteryMinLevel is the battery floor in percent (0-100): mesh work pauses while a
	// battery is present and its level is below it. 0 never pauses.
	BatteryMinLevel int `json:"battery_min_level"`
	// ThermalMaxState is the highest thermal state at which mesh work goes on, one of
	// caps.ThermalNominal, ThermalFair, ThermalSerious, ThermalCritical.
	ThermalMaxState string `json:"thermal_max_state"`
	// MaxTasksPerMin caps the tasks admitted from peers in any 60 s window (tasks); 0 means
	// no limit. At most MaxTasksPerMinLimit.
	MaxTasksPerMin int `json:"max_tasks_per_min"`
	// PauseOnMetered pauses mesh work while the network is metered. The package doc says
	// which traffic that covers.
	PauseOnMetered bool `json:"pause_on_metered"`
	// MaxBytesPerHour caps the mesh traffic of the tasks this node serves for peers, bytes
	// in and out, in any hour (TrafficMeter measures it); 0 means no cap. At most
	// MaxBytesPerHourLimit. Reaching it pauses mesh work (reason bandwidth_cap).
	MaxBytesPerHour int64 `json:"max_bytes_per_hour"`
	// MaxMemoryShare caps the memory this node gives to mesh work (the models it holds for
	// peers, the pipeline stages it runs), in percent (1-100) of the memory available when
	// the node starts; 0 means no cap. The node's budget is the smaller of this share and
	// its --memory-budget (or default share), and is announced as ram.budget_mb.
	MaxMemoryShare int `json:"max_memory_share"`
}

// Profile names, as --profile and the overrides file spell them.
const (
	ProfileEco      = "eco"
	ProfileStandard = "standard"
	ProfilePower    = "power"
	ProfileOff      = "off"
)

// DefaultProfile is the profile of a node whose deployer named none.
const DefaultProfile = ProfileStandard

// MaxTasksPerMinLimit bounds Policy.MaxTasksPerMin (tasks per minute): 10,000 is one task
// every 6 ms, beyond any machine's inference rate, and it bounds the rate limiter's memory to
// 10,000 timestamps.
const MaxTasksPerMinLimit = 10_000

// MaxBytesPerHourLimit bounds Policy.MaxBytesPerHour (bytes per hour): 1 PB an hour is
// beyond any link a node has (2.2 Tbit/s), so no real cap is refused, and a sum of counts
// kept under it never overflows.
const MaxBytesPerHourLimit int64 = 1_000_000_000_000_000

// ProfilePolicy returns the thresholds of the named profile. The package doc has them as a
// table. An unknown name is an error that lists the four profiles.
func ProfilePolicy(name string) (Policy, error) {
	standard := Policy{
		BatteryMinLevel: 30,
		ThermalMaxState: caps.ThermalFair,
		MaxTasksPerMin:  30,
		PauseOnMetered:  true,
		MaxMemoryShare:  50,
	}
	switch name {
	case ProfileEco:
		return Policy{
			RequireCharging: true,
			BatteryMinLevel: 50,
			ThermalMaxState: caps.ThermalFair,
			MaxTasksPerMin:  10,
			PauseOnMetered:  true,
			MaxMemoryShare:  25,
		}, nil
	case ProfileStandard:
		return standard, nil
	case ProfilePower:
		return Policy{
			BatteryMinLevel: 15,
			ThermalMaxState: caps.ThermalSerious,
			MaxTasksPerMin:  120,
			MaxMemoryShare:  75,
		}, nil
	case ProfileOff:
		// Off keeps standard's thresholds, so status shows real numbers and switching back
		// to standard changes nothing but Off.
		off := standard
		off.Off = true
		return off, nil
	}
	return Policy{}, fmt.Errorf("unknown participation profile %q: use %s, %s, %s or %s",
		name, ProfileEco, ProfileStandard, ProfilePower, ProfileOff)
}

// Validate reports the first field out of range: a battery level outside 0-100, an unknown
// thermal state, a task limit outside 0-MaxTasksPerMinLimit, a traffic cap outside
// 0-MaxBytesPerHourLimit or a memory share outside 0-100. The error names the field as the
// overrides file spells it.
func (p Policy) Validate() error {
	if p.BatteryMinLevel < 0 || p.BatteryMinLevel > 100 {
		return fmt.Errorf("battery_min_level %d out of range: use 0 to 100 (percent)", p.BatteryMinLevel)
	}
	if _, ok := thermalRank(p.ThermalMaxState); !ok {
		return fmt.Errorf("thermal_max_state %q unknown: use %s, %s, %s or %s", p.ThermalMaxState,
			caps.ThermalNominal, caps.ThermalFair, caps.ThermalSerious, caps.ThermalCritical)
	}
	if p.MaxTasksPerMin < 0 || p.MaxTasksPerMin > MaxTasksPerMinLimit {
		return fmt.Errorf("max_tasks_per_min %d out of range: use 0 (no limit) to %d", p.MaxTasksPerMin, MaxTasksPerMinLimit)
	}
	if p.MaxBytesPerHour < 0 || p.MaxBytesPerHour > MaxBytesPerHourLimit {
		return fmt.Errorf("max_bytes_per_hour %d out of range: use 0 (no cap) to %d (bytes)", p.MaxBytesPerHour, MaxBytesPerHourLimit)
	}
	if p.MaxMemoryShare < 0 || p.MaxMemoryShare > 100 {
		return fmt.Errorf("max_memory_share %d out of range: use 0 (no cap) to 100 (percent)", p.MaxMemoryShare)
	}
	return nil
}

// Stricter combines two policies field by field, keeping the stricter value of each: Off,
// RequireCharging and PauseOnMetered if either sets them, the higher BatteryMinLevel, the
// lower ThermalMaxState, and the smaller positive MaxTasksPerMin, MaxBytesPerHour and
// MaxMemoryShare (0 means no limit, so 0 and n give n). It is commutative, associative and
// idempotent, so the order of the inputs never matters.
func Stricter(a, b Policy) Policy {
	return Policy{
		Off:             a.Off || b.Off,
		RequireCharging: a.RequireCharging || b.RequireCharging,
		BatteryMinLevel: max(a.BatteryMinLevel, b.BatteryMinLevel),
		ThermalMaxState: stricterThermal(a.ThermalMaxState, b.ThermalMaxState),
		MaxTasksPerMin:  stricterLimit(a.MaxTasksPerMin, b.MaxTasksPerMin),
		PauseOnMetered:  a.PauseOnMetered || b.PauseOnMetered,
		MaxBytesPerHour: stricterLimit(a.MaxBytesPerHour, b.MaxBytesPerHour),
		MaxMemoryShare:  stricterLimit(a.MaxMemoryShare, b.MaxMemoryShare),
	}
}

// Effective is the policy the node applies: the stricter of the deployer's policy and the
// owner's settings, field by field, so the owner can tighten the deployer's profile and never
// loosen it. Without recorded consent (have false) it is the deployer's policy; the Governor
// then pauses with no_consent, because Breaches is told consented=false.
func Effective(deployer Policy, c Consent, have bool) Policy {
	if !have {
		return deployer
	}
	return Stricter(deployer, c.OwnerPolicy())
}

// thermalRank orders the caps thermal states: nominal 0, fair 1, serious 2, critical 3. ok is
// false for anything else, including the empty string.
func thermalRank(s string) (rank int, ok bool) {
	switch s {
	case caps.ThermalNominal:
		return 0, true
	case caps.ThermalFair:
		return 1, true
	case caps.ThermalSerious:
		return 2, true
	case caps.ThermalCritical:
		return 3, true
	}
	return 0, false
}

// allowedRank is the rank of a policy's ThermalMaxState. An unknown state allows nothing: it
// ranks below nominal, so every reading breaches it (fail closed).
func allowedRank(s string) int {
	if r, ok := thermalRank(s); ok {
		return r
	}
	return -1
}

// readingRank is the rank of a measured thermal state. An unknown reading ranks above
// critical, so it breaches every policy (fail closed).
func readingRank(s string) int {
	if r, ok := thermalRank(s); ok {
		return r
	}
	return 4
}

// stricterThermal returns the state that allows less. Between two unknown states it returns
// the lexically smaller, which keeps Stricter commutative.
func stricterThermal(a, b string) string {
	ra, rb := allowedRank(a), allowedRank(b)
	switch {
	case ra < rb:
		return a
	case rb < ra:
		return b
	}
	return min(a, b)
}

// stricterLimit returns the smaller positive limit; a limit of 0 (or below) is no limit.
func stricterLimit[T int | int64](a, b T) T {
	switch {
	case a <= 0 && b <= 0:
		return min(a, b)
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}
