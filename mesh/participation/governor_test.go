package participation

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

const hb = DefaultHeartbeat

func TestDefaultParams(t *testing.T) {
	if got, want := DefaultParams(hb), (Params{RecoverBeats: 3, BackoffWindow: 2 * time.Minute}); got != want {
		t.Fatalf("DefaultParams(15s) = %+v, want %+v", got, want)
	}
	if got, want := DefaultParams(time.Second), (Params{RecoverBeats: 3, BackoffWindow: 8 * time.Second}); got != want {
		t.Fatalf("DefaultParams(1s) = %+v, want %+v", got, want)
	}
	if got := DefaultParams(0); got != DefaultParams(hb) {
		t.Fatalf("DefaultParams(0) = %+v, want the 15 s default", got)
	}
}

func TestGovernorStart(t *testing.T) {
	std := mustProfile(t, ProfileStandard)
	g := NewGovernor(DefaultParams(hb))
	st := g.State()
	if st.Accepting || !slices.Equal(st.Reasons, []Reason{ReasonSensorsSilent}) || !st.Since.IsZero() {
		t.Fatalf("new Governor state = %+v, want paused by sensors_silent", st)
	}
	// A healthy first observation resumes at once.
	if st := g.Observe(std, healthy(), true, t0); !st.Accepting || !st.Since.Equal(t0) || len(st.Reasons) != 0 || st.HealthyBeats != 1 {
		t.Fatalf("first healthy observation: %+v, want accepting since t0", st)
	}

	// A breaching first observation pauses, and recovery then takes RecoverBeats.
	g = NewGovernor(DefaultParams(hb))
	low := healthy()
	low.BatteryLevel = 10
	if st := g.Observe(std, low, true, t0); st.Accepting || !st.Since.Equal(t0) || !slices.Equal(st.Reasons, []Reason{ReasonBatteryLow}) {
		t.Fatalf("first breaching observation: %+v, want paused by battery_low since t0", st)
	}
	for i := 1; i <= 3; i++ {
		st := g.Observe(std, healthy(), true, t0.Add(time.Duration(i)*hb))
		if st.Accepting != (i == 3) {
			t.Fatalf("healthy beat %d: accepting %v, want %v", i, st.Accepting, i == 3)
		}
	}
}

// TestGovernorDocumentedNumbers walks the package doc's hysteresis table at 15 s.
func TestGovernorDocumentedNumbers(t *testing.T) {
	std := mustProfile(t, ProfileStandard)
	low := healthy()
	low.BatteryLevel = 29
	g := NewGovernor(DefaultParams(hb))
	at := func(beat int) time.Time { return t0.Add(time.Duration(beat) * hb) }
	observe := func(beat int, c Conditions) State { return g.Observe(std, c, true, at(beat)) }

	observe(0, healthy())
	if st := observe(1, low); st.Accepting || !st.Since.Equal(at(1)) {
		t.Fatalf("breach at beat 1: %+v, want paused at once", st)
	}
	for beat := 2; beat <= 3; beat++ {
		st := observe(beat, healthy())
		if st.Accepting || st.HealthyBeats != beat-1 || !slices.Equal(st.Reasons, []Reason{ReasonBatteryLow}) {
			t.Fatalf("beat %d: %+v, want paused by battery_low with %d healthy beats", beat, st, beat-1)
		}
	}
	// The 3rd healthy heartbeat: 30 s after the first healthy one.
	if st := observe(4, healthy()); !st.Accepting || !st.Since.Equal(at(4)) || len(st.Reasons) != 0 {
		t.Fatalf("beat 4: %+v, want accepting", st)
	}
	// A second breach soon after: the backoff holds the resume until 2 min after beat 4.
	observe(5, low)
	for beat := 6; beat < 12; beat++ {
		if st := observe(beat, healthy()); st.Accepting {
			t.Fatalf("beat %d: accepting %v after the previous resume, want the 2 min backoff", beat, at(beat).Sub(at(4)))
		}
	}
	if st := observe(12, healthy()); !st.Accepting {
		t.Fatalf("beat 12 (2 min after the last resume, 6 healthy beats): %+v, want accepting", st)
	}
}

func TestGovernorReasons(t *testing.T) {
	std := mustProfile(t, ProfileStandard)
	g := NewGovernor(DefaultParams(hb))
	g.Observe(std, healthy(), true, t0)
	both := healthy()
	both.BatteryLevel, both.Metered = 5, true
	if st := g.Observe(std, both, true, t0.Add(hb)); !slices.Equal(st.Reasons, []Reason{ReasonBatteryLow, ReasonMetered}) {
		t.Fatalf("reasons = %q, want the current breaches", st.Reasons)
	}
	hot := healthy()
	hot.Thermal = caps.ThermalCritical
	st := g.Observe(std, hot, true, t0.Add(2*hb))
	if !slices.Equal(st.Reasons, []Reason{ReasonThermal}) || !st.Since.Equal(t0.Add(hb)) {
		t.Fatalf("state = %+v, want reasons [thermal] and since the pause began", st)
	}
	// Healthy but waiting out recovery: the latest breaches.
	if st := g.Observe(std, healthy(), true, t0.Add(3*hb)); !slices.Equal(st.Reasons, []Reason{ReasonThermal}) {
		t.Fatalf("reasons while recovering = %q, want [thermal]", st.Reasons)
	}
	// State hands out copies.
	st = g.State()
	st.Reasons[0] = "changed"
	if g.State().Reasons[0] != ReasonThermal {
		t.Fatalf("State().Reasons aliases the governor's")
	}
}

func TestGovernorWithdrawAndOff(t *testing.T) {
	std, off := mustProfile(t, ProfileStandard), mustProfile(t, ProfileOff)
	g := NewGovernor(DefaultParams(hb))
	g.Observe(std, healthy(), true, t0)
	if st := g.Observe(std, healthy(), false, t0.Add(time.Second)); st.Accepting || !slices.Equal(st.Reasons, []Reason{ReasonNoConsent}) {
		t.Fatalf("after withdrawal: %+v, want paused by no_consent at once", st)
	}
	g = NewGovernor(DefaultParams(hb))
	g.Observe(std, healthy(), true, t0)
	if st := g.Observe(off, healthy(), true, t0.Add(time.Second)); st.Accepting || !slices.Equal(st.Reasons, []Reason{ReasonProfileOff}) {
		t.Fatalf("after profile off: %+v, want paused by profile_off at once", st)
	}
}

func TestNewGovernorClampsParams(t *testing.T) {
	std := mustProfile(t, ProfileStandard)
	low := healthy()
	low.BatteryLevel = 1
	g := NewGovernor(Params{RecoverBeats: -5, BackoffWindow: -time.Hour})
	g.Observe(std, low, true, t0)
	if st := g.Observe(std, healthy(), true, t0.Add(hb)); !st.Accepting {
		t.Fatalf("RecoverBeats below 1 should count as 1: %+v", st)
	}
}

// step is one heartbeat of a synthetic trace.
type step struct {
	dt        time.Duration // since the previous observation
	p         Policy
	c         Conditions
	consented bool
}

// traceKinds generate synthetic sensor traces in virtual time.
var traceKinds = map[string]func(t testing.TB, r *rand.Rand, n int) []step{
	// The battery oscillates across the floor with a random period and amplitude.
	"sawtooth": func(t testing.TB, r *rand.Rand, n int) []step {
		p := mustProfile(t, ProfileStandard)
		p.BatteryMinLevel = 20 + r.IntN(60)
		period, amp := 2+r.IntN(20), 1+r.IntN(8)
		out := make([]step, n)
		for i := range out {
			c := healthy()
			phase := i % period
			tri := min(phase, period-phase) // 0 … period/2 … 0
			c.BatteryLevel = p.BatteryMinLevel - amp + 2*amp*tri/max(period/2, 1)
			out[i] = step{dt: jitter(r), p: p, c: c, consented: true}
		}
		return out
	},
	// Every reading is random, mostly healthy.
	"noise": func(t testing.TB, r *rand.Rand, n int) []step {
		p := randPolicy(r)
		p.Off = false
		out := make([]step, n)
		for i := range out {
			c := healthy()
			if r.IntN(4) == 0 {
				c = randConditions(r)
			}
			out[i] = step{dt: jitter(r), p: p, c: c, consented: r.IntN(50) != 0}
		}
		return out
	},
	// Healthy, with single-beat spikes of one breach.
	"spikes": func(t testing.TB, r *rand.Rand, n int) []step {
		p := mustProfile(t, ProfileEco)
		out := make([]step, n)
		for i := range out {
			c := healthy()
			if r.IntN(8) == 0 {
				switch r.IntN(5) {
				case 0:
					c.BatteryLevel = 10
				case 1:
					c.Thermal = caps.ThermalCritical
				case 2:
					c.Metered = true
				case 3:
					c.Charging = false
				case 4:
					c.AppState = caps.AppStateBackground
				}
			}
			out[i] = step{dt: jitter(r), p: p, c: c, consented: true}
		}
		return out
	},
	// Healthy, with runs of silent sensors.
	"silence": func(t testing.TB, r *rand.Rand, n int) []step {
		p := mustProfile(t, ProfilePower)
		out := make([]step, n)
		for i := 0; i < n; {
			run := 1 + r.IntN(12)
			silent := r.IntN(3) == 0
			for ; run > 0 && i < n; run, i = run-1, i+1 {
				c := healthy()
				if silent {
					c = Conditions{BatteryLevel: r.IntN(101), Thermal: thermals[r.IntN(4)]} // garbage, SensorsOK false
				}
				out[i] = step{dt: jitter(r), p: p, c: c, consented: true}
			}
		}
		return out
	},
	// Consent withdrawn mid-trace, sometimes given again; the profile switched off and on.
	"consent": func(t testing.TB, r *rand.Rand, n int) []step {
		std, off := mustProfile(t, ProfileStandard), mustProfile(t, ProfileOff)
		withdraw, regive := r.IntN(n), n
		if randBool(r) {
			regive = withdraw + 1 + r.IntN(n)
		}
		offFrom, offTo := r.IntN(n), r.IntN(n)
		out := make([]step, n)
		for i := range out {
			p := std
			if i >= offFrom && i < offTo {
				p = off
			}
			out[i] = step{dt: jitter(r), p: p, c: healthy(), consented: i < withdraw || i >= regive}
		}
		return out
	},
}

// jitter is a heartbeat of 15 s ± 3 s, with an occasional long gap (a suspended laptop).
func jitter(r *rand.Rand) time.Duration {
	if r.IntN(40) == 0 {
		return time.Duration(2+r.IntN(20)) * hb
	}
	return hb - 3*time.Second + time.Duration(r.Int64N(int64(6*time.Second)))
}

// TestGovernorTraces replays many synthetic traces and checks the hysteresis invariants.
func TestGovernorTraces(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 4))
	names := []string{"sawtooth", "noise", "spikes", "silence", "consent"}
	totals := map[string][2]int{} // pauses, resumes
	for trace := range 3000 {
		kind := names[trace%len(names)]
		params := DefaultParams(hb)
		if trace%3 != 0 {
			params = Params{RecoverBeats: 1 + r.IntN(5), BackoffWindow: time.Duration(r.IntN(20)) * hb}
		}
		steps := traceKinds[kind](t, r, 50+r.IntN(250))
		pauses, resumes := checkTrace(t, fmt.Sprintf("trace %d (%s, %+v)", trace, kind, params), params, steps)
		tot := totals[kind]
		totals[kind] = [2]int{tot[0] + pauses, tot[1] + resumes}
	}
	// The generators must exercise the governor, or the invariants above prove nothing.
	for kind, tot := range totals {
		if tot[0] < 100 || tot[1] < 100 {
			t.Errorf("%s traces: %d pauses, %d resumes; too few to test anything", kind, tot[0], tot[1])
		}
	}
	t.Logf("figure F15: 3000 synthetic traces, hysteresis invariants held; pauses and resumes by kind %v", totals)
}

func checkTrace(t *testing.T, name string, params Params, steps []step) (pauses, resumes int) {
	t.Helper()
	g := NewGovernor(params)
	now := t0
	lastBreach := -1 // index of the latest breaching observation
	var lastResume time.Time
	prev := g.State()
	for i, s := range steps {
		now = now.Add(s.dt)
		st := g.Observe(s.p, s.c, s.consented, now)
		br := Breaches(s.p, s.c, s.consented)
		fail := func(format string, args ...any) {
			t.Fatalf("%s, beat %d (%+v, consented %v): state %+v: %s", name, i, s.c, s.consented, st, fmt.Sprintf(format, args...))
		}
		if len(br) > 0 {
			lastBreach = i
			if st.Accepting {
				fail("accepting in a beat that breaches %q", br)
			}
			if !slices.Equal(st.Reasons, br) {
				fail("reasons %q, want the current breaches %q", st.Reasons, br)
			}
			if !s.c.SensorsOK && !slices.Contains(st.Reasons, ReasonSensorsSilent) {
				fail("silent sensors without sensors_silent")
			}
		}
		if st.Accepting {
			if len(st.Reasons) != 0 {
				fail("accepting with reasons")
			}
			if lastBreach >= 0 && i-lastBreach < params.RecoverBeats {
				fail("accepting %d observations after a breach, want %d", i-lastBreach, params.RecoverBeats)
			}
			if lastBreach >= 0 && lastBreach == i-1 && params.RecoverBeats >= 2 {
				fail("accepting on the observation right after a breach")
			}
		} else if len(st.Reasons) == 0 {
			fail("paused without reasons")
		}
		wantHealthy := i + 1
		if lastBreach >= 0 {
			wantHealthy = i - lastBreach
		}
		if st.HealthyBeats != wantHealthy {
			fail("healthy beats %d, want %d", st.HealthyBeats, wantHealthy)
		}
		switch {
		case st.Accepting != prev.Accepting:
			if !st.Since.Equal(now) {
				fail("state changed but since %v, want now %v", st.Since, now)
			}
		case i > 0 && !st.Since.Equal(prev.Since):
			fail("state kept but since moved from %v to %v", prev.Since, st.Since)
		}
		if prev.Accepting && !st.Accepting {
			pauses++
		}
		if !prev.Accepting && st.Accepting && lastBreach >= 0 {
			// A pause→resume cycle: at most one per backoff window.
			if resumes > 0 && now.Sub(lastResume) < params.BackoffWindow {
				fail("resumed %v after the previous resume, want at least %v", now.Sub(lastResume), params.BackoffWindow)
			}
			resumes++
			lastResume = now
		}
		// And no later than the rules say.
		if !st.Accepting && len(br) == 0 && i-lastBreach >= params.RecoverBeats &&
			(resumes == 0 || now.Sub(lastResume) >= params.BackoffWindow) {
			fail("paused although %d healthy beats and the backoff have passed", i-lastBreach)
		}
		prev = st
	}
	// A long healthy run ends accepting.
	std := mustProfile(t, ProfileStandard)
	for range params.RecoverBeats + int(params.BackoffWindow/hb) + 1 {
		now = now.Add(hb)
		prev = g.Observe(std, healthy(), true, now)
	}
	if !prev.Accepting {
		t.Fatalf("%s: still paused after a long healthy run: %+v", name, prev)
	}
	return pauses, resumes
}
