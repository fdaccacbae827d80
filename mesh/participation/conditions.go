package participation

import (
	"math"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// Conditions are the device readings of one heartbeat.
type Conditions struct {
	// BatteryPresent is false on a machine without a battery, which is on mains: such a
	// machine never breaches battery_low or not_charging.
	BatteryPresent bool
	// BatteryLevel is the charge in percent (0-100), meaningful when BatteryPresent.
	BatteryLevel int
	// Charging is true while the battery charges (or is full on mains).
	Charging bool
	// Thermal is one of caps.ThermalNominal, ThermalFair, ThermalSerious, ThermalCritical.
	// Anything else, the empty string included, breaches every policy (reason thermal).
	Thermal string
	// AppState is one of caps.AppStateForeground, AppStateBackgroundTask (both may work)
	// and AppStateBackground (breaches every policy: reason app_background). A desktop is
	// always foreground; anything else, the empty string included, breaches too.
	AppState string
	// Metered is true on a metered network (a phone hotspot, a capped plan).
	Metered bool
	// SensorsOK is false when the sensors did not answer this heartbeat. Then no other
	// field is trusted and the node pauses (reason sensors_silent).
	SensorsOK bool
}

// ConditionsOf reads the conditions a capability vector reports, whatever its runtime: a
// phone's or a browser's battery, thermal state, app state and metered flag weigh exactly as
// a desktop's. sensorsOK says whether the readings behind v were taken this heartbeat. The
// battery level, a fraction in v, becomes whole percent rounded down (0.299 is 29 %: below a
// 30 % floor, as it is); a level that is not a fraction in [0, 1] becomes -1, which
// Breaches takes for silent sensors.
func ConditionsOf(v *caps.Vector, sensorsOK bool) Conditions {
	return Conditions{
		BatteryPresent: v.Battery.Present,
		BatteryLevel:   percent(v.Battery.Level),
		Charging:       v.Battery.Charging,
		Thermal:        v.Thermal,
		AppState:       v.AppState,
		Metered:        v.Net.Metered,
		SensorsOK:      sensorsOK,
	}
}

// percent converts a fraction in [0, 1] to whole percent, rounded down; anything else
// (NaN included) is -1. The nudge undoes binary rounding: 0.29·100 is 28.999999999999996.
func percent(level float64) int {
	if !(level >= 0 && level <= 1) {
		return -1
	}
	return int(math.Floor(level*100 + 1e-9))
}

// Reason says why the node is not accepting work from the mesh. The values are the enum of
// /api/status; the package doc says when each applies.
type Reason string

// The reasons, in the order Breaches reports them.
const (
	ReasonProfileOff    Reason = "profile_off"
	ReasonNoConsent     Reason = "no_consent"
	ReasonSensorsSilent Reason = "sensors_silent"
	ReasonBatteryLow    Reason = "battery_low"
	ReasonNotCharging   Reason = "not_charging"
	ReasonThermal       Reason = "thermal"
	ReasonAppBackground Reason = "app_background"
	ReasonMetered       Reason = "metered"
	// ReasonRateLimited is never a breach: admission reports it when the RateLimiter
	// refuses a task, and status when the limiter is full.
	ReasonRateLimited Reason = "rate_limited"
)

// Breaches returns every way conditions c breach policy p, in a fixed order: profile_off,
// no_consent, sensors_silent, battery_low, not_charging, thermal, app_background, metered. It
// returns nil when there is none. consented is true only when consent is recorded and allows
// contributing (Consent.Contribute). When the sensors are silent (or report a battery level
// outside 0-100) nothing after sensors_silent is reported: no reading is trusted, and the
// node is paused anyway.
func Breaches(p Policy, c Conditions, consented bool) []Reason {
	var rs []Reason
	if p.Off {
		rs = append(rs, ReasonProfileOff)
	}
	if !consented {
		rs = append(rs, ReasonNoConsent)
	}
	if !c.SensorsOK || c.BatteryPresent && (c.BatteryLevel < 0 || c.BatteryLevel > 100) {
		return append(rs, ReasonSensorsSilent)
	}
	if c.BatteryPresent && c.BatteryLevel < p.BatteryMinLevel {
		rs = append(rs, ReasonBatteryLow)
	}
	if c.BatteryPresent && p.RequireCharging && !c.Charging {
		rs = append(rs, ReasonNotCharging)
	}
	if readingRank(c.Thermal) > allowedRank(p.ThermalMaxState) {
		rs = append(rs, ReasonThermal)
	}
	if c.AppState != caps.AppStateForeground && c.AppState != caps.AppStateBackgroundTask {
		rs = append(rs, ReasonAppBackground)
	}
	if p.PauseOnMetered && c.Metered {
		rs = append(rs, ReasonMetered)
	}
	return rs
}
