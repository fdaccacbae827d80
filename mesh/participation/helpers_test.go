package participation

import (
	"strings"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// t0 is an arbitrary fixed start; tests advance time by adding to it.
var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// healthy are conditions that breach no profile: a laptop, charging, cool, unmetered.
func healthy() Conditions {
	return Conditions{BatteryPresent: true, BatteryLevel: 80, Charging: true, Thermal: caps.ThermalNominal,
		AppState: caps.AppStateForeground, SensorsOK: true}
}

func mustProfile(t testing.TB, name string) Policy {
	t.Helper()
	p, err := ProfilePolicy(name)
	if err != nil {
		t.Fatalf("ProfilePolicy(%q): %v", name, err)
	}
	return p
}

// wantErr fails unless err is non-nil and its message holds every part.
func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("err = nil, want an error mentioning %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("err = %q, want it to mention %q", err, p)
		}
	}
}

func ptr[T any](v T) *T { return &v }
