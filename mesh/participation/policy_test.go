package participation

import (
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

func TestProfiles(t *testing.T) {
	tests := []struct {
		name string
		want Policy
	}{
		{ProfileEco, Policy{RequireCharging: true, BatteryMinLevel: 50, ThermalMaxState: caps.ThermalFair, MaxTasksPerMin: 10, PauseOnMetered: true, MaxMemoryShare: 25}},
		{ProfileStandard, Policy{BatteryMinLevel: 30, ThermalMaxState: caps.ThermalFair, MaxTasksPerMin: 30, PauseOnMetered: true, MaxMemoryShare: 50}},
		{ProfilePower, Policy{BatteryMinLevel: 15, ThermalMaxState: caps.ThermalSerious, MaxTasksPerMin: 120, MaxMemoryShare: 75}},
		{ProfileOff, Policy{Off: true, BatteryMinLevel: 30, ThermalMaxState: caps.ThermalFair, MaxTasksPerMin: 30, PauseOnMetered: true, MaxMemoryShare: 50}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mustProfile(t, tt.name)
			if got != tt.want {
				t.Fatalf("ProfilePolicy(%q) = %+v, want %+v", tt.name, got, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("profile %s invalid: %v", tt.name, err)
			}
		})
	}
	if DefaultProfile != ProfileStandard {
		t.Fatalf("DefaultProfile = %q, want standard", DefaultProfile)
	}
}

func TestProfileUnknown(t *testing.T) {
	for _, name := range []string{"", "Eco", "turbo", "standard "} {
		_, err := ProfilePolicy(name)
		wantErr(t, err, strconv.Quote(name), "eco", "standard", "power", "off")
	}
}

// TestDocProfileTable keeps the table in doc.go, which the README copies, equal to the code.
func TestDocProfileTable(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatalf("read doc.go: %v", err)
	}
	yes := func(s string) bool { return s == "yes" }
	seen := 0
	for line := range strings.Lines(string(src)) {
		cells := strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "//")), "|")
		if len(cells) != 11 {
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		name, _, _ := strings.Cut(cells[1], " ")
		want, err := ProfilePolicy(name)
		if err != nil {
			continue // the header and the rule
		}
		seen++
		level, err1 := strconv.Atoi(strings.TrimSuffix(cells[4], " %"))
		rate, err2 := strconv.Atoi(cells[6])
		var traffic int64
		var err3 error
		if cells[8] != "none" {
			traffic, err3 = strconv.ParseInt(cells[8], 10, 64)
		}
		share, err4 := strconv.Atoi(strings.TrimSuffix(cells[9], " %"))
		got := Policy{Off: yes(cells[2]), RequireCharging: yes(cells[3]), BatteryMinLevel: level,
			ThermalMaxState: cells[5], MaxTasksPerMin: rate, PauseOnMetered: yes(cells[7]), MaxBytesPerHour: traffic,
			MaxMemoryShare: share}
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil || got != want {
			t.Errorf("doc.go row %q says %+v, code says %+v", strings.TrimSpace(line), got, want)
		}
		if strings.Contains(cells[1], "(default)") != (name == DefaultProfile) {
			t.Errorf("doc.go row %q: default marker wrong", strings.TrimSpace(line))
		}
	}
	if seen != 4 {
		t.Fatalf("doc.go profile table has %d profile rows, want 4", seen)
	}
}

func TestValidate(t *testing.T) {
	ok := mustProfile(t, ProfileStandard)
	tests := []struct {
		name   string
		mutate func(*Policy)
		field  string
	}{
		{"negative battery", func(p *Policy) { p.BatteryMinLevel = -1 }, "battery_min_level"},
		{"battery over 100", func(p *Policy) { p.BatteryMinLevel = 101 }, "battery_min_level"},
		{"empty thermal", func(p *Policy) { p.ThermalMaxState = "" }, "thermal_max_state"},
		{"unknown thermal", func(p *Policy) { p.ThermalMaxState = "hot" }, "thermal_max_state"},
		{"thermal wrong case", func(p *Policy) { p.ThermalMaxState = "Fair" }, "thermal_max_state"},
		{"negative rate", func(p *Policy) { p.MaxTasksPerMin = -1 }, "max_tasks_per_min"},
		{"rate over limit", func(p *Policy) { p.MaxTasksPerMin = MaxTasksPerMinLimit + 1 }, "max_tasks_per_min"},
		{"negative traffic cap", func(p *Policy) { p.MaxBytesPerHour = -1 }, "max_bytes_per_hour"},
		{"traffic cap over limit", func(p *Policy) { p.MaxBytesPerHour = MaxBytesPerHourLimit + 1 }, "max_bytes_per_hour"},
		{"negative memory share", func(p *Policy) { p.MaxMemoryShare = -1 }, "max_memory_share"},
		{"memory share over 100", func(p *Policy) { p.MaxMemoryShare = 101 }, "max_memory_share"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := ok
			tt.mutate(&p)
			wantErr(t, p.Validate(), tt.field)
		})
	}
	for _, p := range []Policy{
		{ThermalMaxState: caps.ThermalCritical},
		{BatteryMinLevel: 100, ThermalMaxState: caps.ThermalNominal, MaxTasksPerMin: MaxTasksPerMinLimit, MaxBytesPerHour: MaxBytesPerHourLimit, MaxMemoryShare: 100},
	} {
		if err := p.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", p, err)
		}
	}
}

func TestStricterFields(t *testing.T) {
	a := Policy{BatteryMinLevel: 20, ThermalMaxState: caps.ThermalSerious, MaxTasksPerMin: 0, MaxBytesPerHour: 5 << 20}
	b := Policy{Off: true, RequireCharging: true, BatteryMinLevel: 10, ThermalMaxState: caps.ThermalFair, MaxTasksPerMin: 40, PauseOnMetered: true}
	want := Policy{Off: true, RequireCharging: true, BatteryMinLevel: 20, ThermalMaxState: caps.ThermalFair, MaxTasksPerMin: 40, PauseOnMetered: true,
		MaxBytesPerHour: 5 << 20}
	if got := Stricter(a, b); got != want {
		t.Fatalf("Stricter = %+v, want %+v", got, want)
	}
	if got := Stricter(Policy{MaxBytesPerHour: 7}, Policy{MaxBytesPerHour: 3}); got.MaxBytesPerHour != 3 {
		t.Fatalf("Stricter traffic caps 7 and 3 = %d, want the smaller", got.MaxBytesPerHour)
	}
	for _, tt := range [][3]int{{25, 50, 25}, {75, 0, 75}, {0, 0, 0}, {100, 1, 1}} {
		if got := Stricter(Policy{MaxMemoryShare: tt[0]}, Policy{MaxMemoryShare: tt[1]}); got.MaxMemoryShare != tt[2] {
			t.Fatalf("Stricter memory shares %d and %d = %d, want %d", tt[0], tt[1], got.MaxMemoryShare, tt[2])
		}
	}
	if got := Stricter(Policy{MaxTasksPerMin: 5, ThermalMaxState: caps.ThermalFair}, Policy{MaxTasksPerMin: 9, ThermalMaxState: "bogus"}); got.MaxTasksPerMin != 5 || got.ThermalMaxState != "bogus" {
		t.Fatalf("Stricter = %+v, want the smaller limit 5 and the unknown (allow-nothing) thermal state", got)
	}
}

// looserField names the first field in which e is looser than x, or returns "".
func looserField(e, x Policy) string {
	switch {
	case x.Off && !e.Off:
		return "off"
	case x.RequireCharging && !e.RequireCharging:
		return "require_charging"
	case e.BatteryMinLevel < x.BatteryMinLevel:
		return "battery_min_level"
	case allowedRank(e.ThermalMaxState) > allowedRank(x.ThermalMaxState):
		return "thermal_max_state"
	case x.MaxTasksPerMin > 0 && (e.MaxTasksPerMin <= 0 || e.MaxTasksPerMin > x.MaxTasksPerMin):
		return "max_tasks_per_min"
	case x.PauseOnMetered && !e.PauseOnMetered:
		return "pause_on_metered"
	case x.MaxBytesPerHour > 0 && (e.MaxBytesPerHour <= 0 || e.MaxBytesPerHour > x.MaxBytesPerHour):
		return "max_bytes_per_hour"
	case x.MaxMemoryShare > 0 && (e.MaxMemoryShare <= 0 || e.MaxMemoryShare > x.MaxMemoryShare):
		return "max_memory_share"
	}
	return ""
}

var thermals = [...]string{caps.ThermalNominal, caps.ThermalFair, caps.ThermalSerious, caps.ThermalCritical}

func randBool(r *rand.Rand) bool { return r.IntN(2) == 0 }

// randPolicy is any valid policy, with the edge values (0, 100, no limit) often.
func randPolicy(r *rand.Rand) Policy {
	levels := []int{0, 100, r.IntN(101)}
	rates := []int{0, 1, MaxTasksPerMinLimit, r.IntN(200)}
	return Policy{
		Off:             r.IntN(5) == 0,
		RequireCharging: randBool(r),
		BatteryMinLevel: levels[r.IntN(len(levels))],
		ThermalMaxState: thermals[r.IntN(len(thermals))],
		MaxTasksPerMin:  rates[r.IntN(len(rates))],
		PauseOnMetered:  randBool(r),
		MaxBytesPerHour: randBytes(r),
		MaxMemoryShare:  []int{0, 1, 100, r.IntN(101)}[r.IntN(4)],
	}
}

// randBytes is any valid traffic cap, with the edge values (no cap, 1, the limit) often.
func randBytes(r *rand.Rand) int64 {
	caps := []int64{0, 1, MaxBytesPerHourLimit, r.Int64N(1 << 32)}
	return caps[r.IntN(len(caps))]
}

// randDeployer is a profile with random overrides half of the time, any valid policy otherwise.
func randDeployer(t *testing.T, r *rand.Rand) Policy {
	if randBool(r) {
		return randPolicy(r)
	}
	names := []string{ProfileEco, ProfileStandard, ProfilePower, ProfileOff}
	x := randPolicy(r)
	var o Overrides
	if randBool(r) {
		o.RequireCharging = &x.RequireCharging
	}
	if randBool(r) {
		o.BatteryMinLevel = &x.BatteryMinLevel
	}
	if randBool(r) {
		o.ThermalMaxState = &x.ThermalMaxState
	}
	if randBool(r) {
		o.MaxTasksPerMin = &x.MaxTasksPerMin
	}
	if randBool(r) {
		o.PauseOnMetered = &x.PauseOnMetered
	}
	if randBool(r) {
		o.MaxBytesPerHour = &x.MaxBytesPerHour
	}
	if randBool(r) {
		o.MaxMemoryShare = &x.MaxMemoryShare
	}
	p, err := Deployer(names[r.IntN(len(names))], o)
	if err != nil {
		t.Fatalf("Deployer with valid overrides %+v: %v", o, err)
	}
	return p
}

// randConsent is any valid consent record, every one of the owner's limits included (an
// unset thermal ceiling, as records made before it was asked have, too).
func randConsent(r *rand.Rand) Consent {
	x := randPolicy(r)
	thermal := x.ThermalMaxState
	if r.IntN(5) == 0 {
		thermal = ""
	}
	return Consent{
		Version: ConsentVersion, GivenAt: t0,
		RunLocal: randBool(r), Contribute: randBool(r), CloudFallback: randBool(r),
		BatteryFloor: []int{0, 100, r.IntN(101)}[r.IntN(3)], PauseOnMetered: randBool(r),
		RequireCharging: x.RequireCharging, ThermalMaxState: thermal, MaxTasksPerMin: x.MaxTasksPerMin,
		MaxBytesPerHour: x.MaxBytesPerHour, MaxMemoryShare: x.MaxMemoryShare,
	}
}

// randTraffic is a last hour's mesh traffic, near the caps randPolicy picks often.
func randTraffic(r *rand.Rand) int64 {
	t := []int64{0, 1, 2, MaxBytesPerHourLimit, r.Int64N(1 << 32)}
	return t[r.IntN(len(t))]
}

func randConditions(r *rand.Rand) Conditions {
	th := thermals[r.IntN(len(thermals))]
	if r.IntN(20) == 0 {
		th = "" // an unknown reading
	}
	app := []string{caps.AppStateForeground, caps.AppStateBackgroundTask, caps.AppStateBackground, ""}[r.IntN(4)]
	return Conditions{
		BatteryPresent: r.IntN(4) != 0, BatteryLevel: r.IntN(101), Charging: randBool(r),
		Thermal: th, AppState: app, Metered: randBool(r), SensorsOK: r.IntN(10) != 0,
	}
}

// TestEffectiveNeverLooser is the property: for random deployer policies and owner
// consents, the effective policy is never looser than either, field by field, and never
// admits under conditions that either would refuse.
func TestEffectiveNeverLooser(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 1))
	for i := range 20_000 {
		d, c, have := randDeployer(t, r), randConsent(r), r.IntN(4) != 0
		e := Effective(d, c, have)
		if err := e.Validate(); err != nil {
			t.Fatalf("#%d: Effective(%+v, %+v) = %+v, invalid: %v", i, d, c, e, err)
		}
		if f := looserField(e, d); f != "" {
			t.Fatalf("#%d: effective %+v looser than deployer %+v in %s", i, e, d, f)
		}
		if !have {
			if e != d {
				t.Fatalf("#%d: without consent Effective = %+v, want the deployer's %+v", i, e, d)
			}
			continue
		}
		o := c.OwnerPolicy()
		if f := looserField(e, o); f != "" {
			t.Fatalf("#%d: effective %+v looser than owner %+v in %s", i, e, o, f)
		}
		// Semantically: every breach of either input is a breach of the effective policy,
		// the traffic cap's included.
		cond, traffic := randConditions(r), randTraffic(r)
		got := append(Breaches(e, cond, true), TrafficBreaches(e, traffic)...)
		for _, x := range []Policy{d, o} {
			for _, reason := range append(Breaches(x, cond, true), TrafficBreaches(x, traffic)...) {
				if !slices.Contains(got, reason) {
					t.Fatalf("#%d: conditions %+v breach %+v (%s) but not effective %+v", i, cond, x, reason, e)
				}
			}
		}
	}
}

func TestStricterAlgebra(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 2))
	for i := range 20_000 {
		a, b, c := randPolicy(r), randPolicy(r), randPolicy(r)
		ab := Stricter(a, b)
		if ba := Stricter(b, a); ab != ba {
			t.Fatalf("#%d: not commutative: %+v vs %+v", i, ab, ba)
		}
		if aa := Stricter(a, a); aa != a {
			t.Fatalf("#%d: not idempotent: Stricter(%+v, itself) = %+v", i, a, aa)
		}
		if l, rr := Stricter(ab, c), Stricter(a, Stricter(b, c)); l != rr {
			t.Fatalf("#%d: not associative: %+v vs %+v", i, l, rr)
		}
		if looserField(ab, a) != "" || looserField(ab, b) != "" {
			t.Fatalf("#%d: Stricter(%+v, %+v) = %+v is looser than an input", i, a, b, ab)
		}
		// Not stricter than needed: every field comes from one of the inputs.
		if !(ab.BatteryMinLevel == a.BatteryMinLevel || ab.BatteryMinLevel == b.BatteryMinLevel) ||
			!(ab.ThermalMaxState == a.ThermalMaxState || ab.ThermalMaxState == b.ThermalMaxState) ||
			!(ab.MaxTasksPerMin == a.MaxTasksPerMin || ab.MaxTasksPerMin == b.MaxTasksPerMin) ||
			!(ab.MaxBytesPerHour == a.MaxBytesPerHour || ab.MaxBytesPerHour == b.MaxBytesPerHour) ||
			!(ab.MaxMemoryShare == a.MaxMemoryShare || ab.MaxMemoryShare == b.MaxMemoryShare) ||
			ab.Off != (a.Off || b.Off) || ab.RequireCharging != (a.RequireCharging || b.RequireCharging) ||
			ab.PauseOnMetered != (a.PauseOnMetered || b.PauseOnMetered) {
			t.Fatalf("#%d: Stricter(%+v, %+v) = %+v invents a value", i, a, b, ab)
		}
	}
}

// TestOwnerLoosestKeepsDeployer: an owner who asks for nothing beyond the defaults of the
// loosest kind leaves every deployer policy as it is.
func TestOwnerLoosestKeepsDeployer(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 3))
	loose := Consent{Version: ConsentVersion, GivenAt: t0, Contribute: true}
	for range 1000 {
		d := randPolicy(r)
		if e := Effective(d, loose, true); e != d {
			t.Fatalf("Effective(%+v, loosest owner) = %+v, want the deployer's policy", d, e)
		}
	}
	// The prompt's defaults on the standard profile change nothing either.
	std := mustProfile(t, ProfileStandard)
	def := Consent{Version: ConsentVersion, GivenAt: t0, Contribute: true, BatteryFloor: DefaultBatteryFloor, PauseOnMetered: DefaultPauseOnMetered}
	if e := Effective(std, def, true); e != std {
		t.Fatalf("standard with default consent = %+v, want %+v", e, std)
	}
	// The owner tightens power.
	power := mustProfile(t, ProfilePower)
	e := Effective(power, def, true)
	if e.BatteryMinLevel != 30 || !e.PauseOnMetered || e.ThermalMaxState != caps.ThermalSerious || e.MaxTasksPerMin != 120 {
		t.Fatalf("power with default consent = %+v, want floor 30 and pause on metered, the rest power's", e)
	}
}

// TestOwnerCanTightenEveryField: every field the deployer's policy sets, but off (the
// owner's "no" is not contributing), the owner's consent can set too, to its strictest, and
// the effective policy then has the owner's value. A field added to Policy fails here until
// the owner can tighten it.
func TestOwnerCanTightenEveryField(t *testing.T) {
	strictest := Policy{Off: true, RequireCharging: true, BatteryMinLevel: 100, ThermalMaxState: caps.ThermalNominal,
		MaxTasksPerMin: 1, PauseOnMetered: true, MaxBytesPerHour: 1, MaxMemoryShare: 1}
	v := reflect.ValueOf(strictest)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("Policy.%s is not set in this test's strictest policy: add it, and let the owner tighten it", v.Type().Field(i).Name)
		}
	}
	owner := Consent{Version: ConsentVersion, GivenAt: t0, Contribute: true,
		BatteryFloor: 100, PauseOnMetered: true, RequireCharging: true, ThermalMaxState: caps.ThermalNominal,
		MaxTasksPerMin: 1, MaxBytesPerHour: 1, MaxMemoryShare: 1}
	want := strictest
	want.Off = false
	if got := owner.OwnerPolicy(); got != want {
		t.Fatalf("OwnerPolicy of the strictest owner = %+v, want %+v", got, want)
	}
	loosest := Policy{ThermalMaxState: caps.ThermalCritical} // what a deployer can set at most
	if got := Effective(loosest, owner, true); got != want {
		t.Fatalf("the strictest owner on the loosest deployer = %+v, want every field the owner's: %+v", got, want)
	}
}
