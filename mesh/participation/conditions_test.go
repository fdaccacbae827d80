package participation

import (
	"slices"
	"testing"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

func TestBreaches(t *testing.T) {
	std := mustProfile(t, ProfileStandard) // floor 30, fair, pause on metered
	eco := mustProfile(t, ProfileEco)      // floor 50, charging, fair, pause on metered
	power := mustProfile(t, ProfilePower)  // floor 15, serious, ignores metered
	off := mustProfile(t, ProfileOff)
	with := func(f func(*Conditions)) Conditions { c := healthy(); f(&c); return c }
	mains := with(func(c *Conditions) { c.BatteryPresent, c.BatteryLevel, c.Charging = false, 0, false })

	tests := []struct {
		name      string
		p         Policy
		c         Conditions
		consented bool
		want      []Reason
	}{
		{"healthy", std, healthy(), true, nil},
		{"profile off", off, healthy(), true, []Reason{ReasonProfileOff}},
		{"no consent", std, healthy(), false, []Reason{ReasonNoConsent}},
		{"off and no consent", off, healthy(), false, []Reason{ReasonProfileOff, ReasonNoConsent}},
		{"battery at floor", std, with(func(c *Conditions) { c.BatteryLevel = 30 }), true, nil},
		{"battery below floor", std, with(func(c *Conditions) { c.BatteryLevel = 29 }), true, []Reason{ReasonBatteryLow}},
		{"battery low even charging", eco, with(func(c *Conditions) { c.BatteryLevel = 49 }), true, []Reason{ReasonBatteryLow}},
		{"not charging", eco, with(func(c *Conditions) { c.Charging = false }), true, []Reason{ReasonNotCharging}},
		{"not charging allowed", std, with(func(c *Conditions) { c.Charging = false }), true, nil},
		{"mains never battery", eco, mains, true, nil},
		{"thermal at max", std, with(func(c *Conditions) { c.Thermal = caps.ThermalFair }), true, nil},
		{"thermal above max", std, with(func(c *Conditions) { c.Thermal = caps.ThermalSerious }), true, []Reason{ReasonThermal}},
		{"thermal serious on power", power, with(func(c *Conditions) { c.Thermal = caps.ThermalSerious }), true, nil},
		{"thermal critical on power", power, with(func(c *Conditions) { c.Thermal = caps.ThermalCritical }), true, []Reason{ReasonThermal}},
		{"thermal unknown", power, with(func(c *Conditions) { c.Thermal = "toasty" }), true, []Reason{ReasonThermal}},
		{"thermal empty", Policy{ThermalMaxState: caps.ThermalCritical}, with(func(c *Conditions) { c.Thermal = "" }), true, []Reason{ReasonThermal}},
		{"policy thermal unknown", Policy{ThermalMaxState: "x"}, healthy(), true, []Reason{ReasonThermal}},
		{"metered", std, with(func(c *Conditions) { c.Metered = true }), true, []Reason{ReasonMetered}},
		{"metered allowed", power, with(func(c *Conditions) { c.Metered = true }), true, nil},
		{"sensors silent", std, Conditions{}, true, []Reason{ReasonSensorsSilent}},
		{"silent hides readings", std, with(func(c *Conditions) { c.SensorsOK, c.BatteryLevel, c.Metered = false, 1, true }), true,
			[]Reason{ReasonSensorsSilent}},
		{"silent after off and consent", off, with(func(c *Conditions) { c.SensorsOK = false }), false,
			[]Reason{ReasonProfileOff, ReasonNoConsent, ReasonSensorsSilent}},
		{"impossible level", std, with(func(c *Conditions) { c.BatteryLevel = 101 }), true, []Reason{ReasonSensorsSilent}},
		{"negative level", Policy{ThermalMaxState: caps.ThermalCritical}, with(func(c *Conditions) { c.BatteryLevel = -1 }), true,
			[]Reason{ReasonSensorsSilent}},
		{"everything, in order", Stricter(eco, off), with(func(c *Conditions) {
			c.BatteryLevel, c.Charging, c.Thermal, c.Metered = 10, false, caps.ThermalCritical, true
		}), false, []Reason{ReasonProfileOff, ReasonNoConsent, ReasonBatteryLow, ReasonNotCharging, ReasonThermal, ReasonMetered}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Breaches(tt.p, tt.c, tt.consented)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Breaches(%+v, %+v, %v) = %q, want %q", tt.p, tt.c, tt.consented, got, tt.want)
			}
		})
	}
}

func TestReasonValues(t *testing.T) {
	got := []Reason{ReasonBatteryLow, ReasonNotCharging, ReasonThermal, ReasonMetered, ReasonRateLimited,
		ReasonNoConsent, ReasonSensorsSilent, ReasonProfileOff}
	want := []Reason{"battery_low", "not_charging", "thermal", "metered", "rate_limited", "no_consent", "sensors_silent", "profile_off"}
	if !slices.Equal(got, want) {
		t.Fatalf("reasons = %q, want %q (the /api/status enum)", got, want)
	}
}
