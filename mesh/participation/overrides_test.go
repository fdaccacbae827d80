package participation

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	return path
}

func TestDeployer(t *testing.T) {
	eco, std, power := mustProfile(t, ProfileEco), mustProfile(t, ProfileStandard), mustProfile(t, ProfilePower)
	with := func(p Policy, f func(*Policy)) Policy { f(&p); return p }
	tests := []struct {
		name string
		flag string
		o    Overrides
		want Policy
	}{
		{"default", "", Overrides{}, std},
		{"flag", ProfilePower, Overrides{}, power},
		{"file profile", "", Overrides{Profile: ProfileEco}, eco},
		{"flag wins over file", ProfilePower, Overrides{Profile: ProfileEco}, power},
		{"loosen own profile", ProfileEco, Overrides{RequireCharging: ptr(false), BatteryMinLevel: ptr(0), MaxTasksPerMin: ptr(0)},
			with(eco, func(p *Policy) { p.RequireCharging, p.BatteryMinLevel, p.MaxTasksPerMin = false, 0, 0 })},
		{"tighten", ProfilePower, Overrides{ThermalMaxState: ptr(caps.ThermalNominal), PauseOnMetered: ptr(true)},
			with(power, func(p *Policy) { p.ThermalMaxState, p.PauseOnMetered = caps.ThermalNominal, true })},
		{"traffic cap", ProfileStandard, Overrides{MaxBytesPerHour: ptr(int64(500_000_000))},
			with(std, func(p *Policy) { p.MaxBytesPerHour = 500_000_000 })},
		{"memory share", ProfileEco, Overrides{MaxMemoryShare: ptr(60)},
			with(eco, func(p *Policy) { p.MaxMemoryShare = 60 })},
		{"no memory cap", ProfilePower, Overrides{MaxMemoryShare: ptr(0)},
			with(power, func(p *Policy) { p.MaxMemoryShare = 0 })},
		{"off keeps off", ProfileOff, Overrides{BatteryMinLevel: ptr(5)},
			with(mustProfile(t, ProfileOff), func(p *Policy) { p.BatteryMinLevel = 5 })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Deployer(tt.flag, tt.o)
			if err != nil {
				t.Fatalf("Deployer: %v", err)
			}
			if got != tt.want {
				t.Fatalf("Deployer(%q, %+v) = %+v, want %+v", tt.flag, tt.o, got, tt.want)
			}
		})
	}
}

func TestDeployerRejects(t *testing.T) {
	tests := []struct {
		name  string
		flag  string
		o     Overrides
		field string
	}{
		{"unknown flag profile", "turbo", Overrides{}, "turbo"},
		{"unknown file profile", "", Overrides{Profile: "turbo"}, "turbo"},
		{"battery", "", Overrides{BatteryMinLevel: ptr(101)}, "battery_min_level"},
		{"thermal", "", Overrides{ThermalMaxState: ptr("hot")}, "thermal_max_state"},
		{"rate", "", Overrides{MaxTasksPerMin: ptr(-1)}, "max_tasks_per_min"},
		{"traffic", "", Overrides{MaxBytesPerHour: ptr(int64(-1))}, "max_bytes_per_hour"},
		{"memory share", "", Overrides{MaxMemoryShare: ptr(101)}, "max_memory_share"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Deployer(tt.flag, tt.o)
			wantErr(t, err, tt.field)
		})
	}
}

func TestLoadOverrides(t *testing.T) {
	path := writeFile(t, "participation.json", `{
		"profile": "eco",
		"require_charging": false,
		"battery_min_level": 40,
		"thermal_max_state": "serious",
		"max_tasks_per_min": 20,
		"pause_on_metered": null,
		"max_bytes_per_hour": 2000000000,
		"max_memory_share": 40
	}`)
	o, err := LoadOverrides(path)
	if err != nil {
		t.Fatalf("LoadOverrides: %v", err)
	}
	if o.Profile != ProfileEco || o.RequireCharging == nil || *o.RequireCharging || *o.BatteryMinLevel != 40 ||
		*o.ThermalMaxState != caps.ThermalSerious || *o.MaxTasksPerMin != 20 || o.PauseOnMetered != nil ||
		o.MaxBytesPerHour == nil || *o.MaxBytesPerHour != 2_000_000_000 || o.MaxMemoryShare == nil || *o.MaxMemoryShare != 40 {
		t.Fatalf("LoadOverrides = %+v", o)
	}
	p, err := Deployer("", o)
	if err != nil {
		t.Fatalf("Deployer: %v", err)
	}
	want := Policy{BatteryMinLevel: 40, ThermalMaxState: caps.ThermalSerious, MaxTasksPerMin: 20, PauseOnMetered: true,
		MaxBytesPerHour: 2_000_000_000, MaxMemoryShare: 40}
	if p != want {
		t.Fatalf("Deployer = %+v, want %+v", p, want)
	}

	empty, err := LoadOverrides(writeFile(t, "empty.json", " {} \n"))
	if err != nil || empty != (Overrides{}) {
		t.Fatalf("LoadOverrides({}) = %+v, %v; want no overrides", empty, err)
	}
}

func TestLoadOverridesBadFiles(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    []string // parts of the message besides the path
	}{
		{"unknown field", `{"profile": "eco", "battery_floor": 20}`, []string{`"battery_floor"`, "battery_min_level"}},
		{"wrong case", `{"Profile": "eco"}`, []string{`"Profile"`, "the fields are"}},
		{"string for number", `{"battery_min_level": "40"}`, []string{"battery_min_level", "whole number"}},
		{"number for bool", `{"pause_on_metered": 1}`, []string{"pause_on_metered", "true or false"}},
		{"fraction", `{"max_tasks_per_min": 2.5}`, []string{"max_tasks_per_min", "whole number"}},
		{"battery out of range", `{"battery_min_level": 150}`, []string{"battery_min_level", "0 to 100"}},
		{"unknown thermal", `{"thermal_max_state": "warm"}`, []string{"thermal_max_state", "nominal"}},
		{"rate out of range", `{"max_tasks_per_min": 1000000}`, []string{"max_tasks_per_min"}},
		{"traffic cap negative", `{"max_bytes_per_hour": -1}`, []string{"max_bytes_per_hour", "0 (no cap)"}},
		{"traffic cap too large", `{"max_bytes_per_hour": 1000000000000001}`, []string{"max_bytes_per_hour"}},
		{"traffic cap fraction", `{"max_bytes_per_hour": 1.5e9}`, []string{"max_bytes_per_hour", "whole number"}},
		{"traffic cap string", `{"max_bytes_per_hour": "2GB"}`, []string{"max_bytes_per_hour", "whole number"}},
		{"memory share out of range", `{"max_memory_share": 120}`, []string{"max_memory_share", "0 (no cap) to 100"}},
		{"memory share fraction", `{"max_memory_share": 0.5}`, []string{"max_memory_share", "whole number"}},
		{"unknown profile", `{"profile": "turbo"}`, []string{"profile", "turbo", "eco"}},
		{"syntax", `{"profile": "eco",}`, []string{"invalid JSON", "byte"}},
		{"truncated", `{"profile": "eco"`, []string{"JSON object"}},
		{"two objects", `{"profile": "eco"} {"profile": "power"}`, []string{"invalid JSON"}},
		{"array", `[{"profile": "eco"}]`, []string{"array", "not an object"}},
		{"null", `null`, []string{"null"}},
		{"empty", "  \n", []string{"empty"}},
		{"too large", `{"profile": "eco"}` + strings.Repeat(" ", maxOverridesFile), []string{"64 KiB"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, "bad.json", tt.content)
			o, err := LoadOverrides(path)
			wantErr(t, err, append(tt.want, path)...)
			if o != (Overrides{}) {
				t.Errorf("LoadOverrides returned %+v with its error, want zero", o)
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "nope.json")
		_, err := LoadOverrides(path)
		wantErr(t, err, path)
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("err = %v, want fs.ErrNotExist", err)
		}
	})
}

// FuzzDecodeOverrides: any input either fails or yields overrides that Deployer accepts.
func FuzzDecodeOverrides(f *testing.F) {
	for _, s := range []string{`{}`, `{"profile":"eco","battery_min_level":40}`, `{"max_tasks_per_min":null}`,
		`{"thermal_max_state":"critical","pause_on_metered":false}`, `{"max_bytes_per_hour":1000}`, `[1]`, `{"x":1}`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		o, err := decodeOverrides(data)
		if err != nil {
			return
		}
		if _, err := Deployer("", o); err != nil {
			t.Fatalf("decoded %q to %+v, which Deployer rejects: %v", data, o, err)
		}
	})
}
