package participation

import (
	"math"
	"slices"
	"testing"
	"time"

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
		{"app background-task", power, with(func(c *Conditions) { c.AppState = caps.AppStateBackgroundTask }), true, nil},
		{"app background", std, with(func(c *Conditions) { c.AppState = caps.AppStateBackground }), true, []Reason{ReasonAppBackground}},
		{"app background on power", power, with(func(c *Conditions) { c.AppState = caps.AppStateBackground }), true, []Reason{ReasonAppBackground}},
		{"app state unknown", power, with(func(c *Conditions) { c.AppState = "active" }), true, []Reason{ReasonAppBackground}},
		{"app state empty", power, with(func(c *Conditions) { c.AppState = "" }), true, []Reason{ReasonAppBackground}},
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
		{"silent hides app state", std, with(func(c *Conditions) { c.SensorsOK, c.AppState = false, caps.AppStateBackground }), true,
			[]Reason{ReasonSensorsSilent}},
		{"everything, in order", Stricter(eco, off), with(func(c *Conditions) {
			c.BatteryLevel, c.Charging, c.Thermal, c.AppState, c.Metered = 10, false, caps.ThermalCritical, caps.AppStateBackground, true
		}), false, []Reason{ReasonProfileOff, ReasonNoConsent, ReasonBatteryLow, ReasonNotCharging, ReasonThermal, ReasonAppBackground, ReasonMetered}},
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
		ReasonNoConsent, ReasonSensorsSilent, ReasonProfileOff, ReasonAppBackground}
	want := []Reason{"battery_low", "not_charging", "thermal", "metered", "rate_limited", "no_consent", "sensors_silent", "profile_off",
		"app_background"}
	if !slices.Equal(got, want) {
		t.Fatalf("reasons = %q, want %q (the /api/status enum)", got, want)
	}
}

func TestConditionsOfBatteryLevel(t *testing.T) {
	tests := []struct {
		level float64
		want  int
	}{
		{0, 0}, {0.01, 1}, {0.29, 29}, {0.299, 29}, {0.3, 30}, {0.57, 57}, {0.999, 99}, {1, 100},
		{-0.01, -1}, {1.01, -1}, {87, -1}, {math.NaN(), -1}, {math.Inf(1), -1},
	}
	for _, tt := range tests {
		v := &caps.Vector{Battery: caps.Battery{Present: true, Level: tt.level}}
		if got := ConditionsOf(v, true).BatteryLevel; got != tt.want {
			t.Errorf("ConditionsOf(level %v).BatteryLevel = %d, want %d", tt.level, got, tt.want)
		}
	}
	// At the floor is not below it; a hair under is.
	std := mustProfile(t, ProfileStandard) // floor 30
	for level, want := range map[float64][]Reason{0.3: nil, 0.2999: {ReasonBatteryLow}, 1.5: {ReasonSensorsSilent}} {
		v := phone(func(v *caps.Vector) { v.Battery.Level = level })
		if got := Breaches(std, ConditionsOf(v, true), true); !slices.Equal(got, want) {
			t.Errorf("level %v: Breaches = %q, want %q", level, got, want)
		}
	}
}

// desktop returns a valid vector of a laptop on battery, cool, foreground, unmetered,
// changed by mut.
func desktop(mut func(*caps.Vector)) *caps.Vector {
	v := &caps.Vector{
		PeerID: "12D3KooWdesktop", Runtime: caps.RuntimeDesktop,
		CPU: caps.CPU{Cores: 8, Arch: "amd64"}, RAM: caps.RAM{TotalMB: 16_000, FreeMB: 8_000},
		Battery: caps.Battery{Present: true, Level: 0.8, Charging: true, Floor: 0.3},
		Thermal: caps.ThermalNominal, AppState: caps.AppStateForeground,
		Net: caps.Net{Type: caps.NetEthernet}, Seq: 1, IssuedAt: 1, Expires: 2,
	}
	if mut != nil {
		mut(v)
	}
	return v
}

// phone returns desktop's vector as an Android phone in the foreground on Wi-Fi, changed by
// mut.
func phone(mut func(*caps.Vector)) *caps.Vector {
	return desktop(func(v *caps.Vector) {
		v.Runtime, v.CPU.Arch, v.Net.Type = caps.RuntimeAndroid, "arm64", caps.NetWiFi
		if mut != nil {
			mut(v)
		}
	})
}

// TestPhoneConditionsPauseLikeDesktop: a phone's (or browser's) vector feeds the Governor
// through ConditionsOf, and pauses it for the same readings, with the same reasons, as a
// desktop's; its app state pauses it in the background.
func TestPhoneConditionsPauseLikeDesktop(t *testing.T) {
	std := mustProfile(t, ProfileStandard) // floor 30, fair, pause on metered
	tests := []struct {
		name    string
		mut     func(*caps.Vector)
		desktop bool // whether a desktop can report it (app states other than foreground cannot)
		want    []Reason
	}{
		{"healthy", nil, true, nil},
		{"thermal fair", func(v *caps.Vector) { v.Thermal = caps.ThermalFair }, true, nil},
		{"thermal serious", func(v *caps.Vector) { v.Thermal = caps.ThermalSerious }, true, []Reason{ReasonThermal}},
		{"thermal critical", func(v *caps.Vector) { v.Thermal = caps.ThermalCritical }, true, []Reason{ReasonThermal}},
		{"battery under the floor", func(v *caps.Vector) { v.Battery.Level, v.Battery.Charging = 0.29, false }, true,
			[]Reason{ReasonBatteryLow}},
		{"metered", func(v *caps.Vector) { v.Net.Metered = true }, true, []Reason{ReasonMetered}},
		{"background task", func(v *caps.Vector) { v.AppState = caps.AppStateBackgroundTask }, false, nil},
		{"background", func(v *caps.Vector) { v.AppState = caps.AppStateBackground }, false, []Reason{ReasonAppBackground}},
		{"background and hot", func(v *caps.Vector) { v.AppState, v.Thermal = caps.AppStateBackground, caps.ThermalSerious }, false,
			[]Reason{ReasonThermal, ReasonAppBackground}},
	}
	const hb = 15 * time.Second
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vectors := map[string]*caps.Vector{
				"android": phone(tt.mut),
				"ios":     phone(func(v *caps.Vector) { v.Runtime = caps.RuntimeIOS; apply(tt.mut, v) }),
				"browser": phone(func(v *caps.Vector) { v.Runtime = caps.RuntimeBrowser; apply(tt.mut, v) }),
			}
			if tt.desktop {
				vectors["desktop"] = desktop(tt.mut)
			}
			for name, v := range vectors {
				if err := v.Validate(); err != nil {
					t.Fatalf("%s: the test's vector is invalid: %v", name, err)
				}
				g := NewGovernor(DefaultParams(hb))
				if st := g.Observe(std, ConditionsOf(desktop(nil), true), true, t0); !st.Accepting {
					t.Fatalf("%s: a healthy start is paused: %q", name, st.Reasons)
				}
				st := g.Observe(std, ConditionsOf(v, true), true, t0.Add(hb))
				if st.Accepting != (tt.want == nil) || !slices.Equal(st.Reasons, tt.want) {
					t.Fatalf("%s: accepting %v reasons %q, want reasons %q", name, st.Accepting, st.Reasons, tt.want)
				}
			}
		})
	}
}

func apply(mut func(*caps.Vector), v *caps.Vector) {
	if mut != nil {
		mut(v)
	}
}
