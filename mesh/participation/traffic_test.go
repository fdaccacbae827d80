package participation

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The sliding hour, to the minute: bytes count for at least an hour, and leave at the first
// minute boundary an hour or more after they were moved.
func TestTrafficMeterSlidingHour(t *testing.T) {
	var m TrafficMeter
	if got := m.Total(t0); got != 0 {
		t.Fatalf("zero meter Total = %d, want 0", got)
	}
	at := t0.Add(30 * time.Second) // mid-minute 0
	m.Add(100, at)
	m.Add(0, at)  // nothing
	m.Add(-5, at) // nothing
	m.Add(20, at.Add(10*time.Minute))
	m.Add(3, at.Add(59*time.Minute))
	for _, tt := range []struct {
		dt   time.Duration // after at
		want int64
	}{
		{0, 123}, // a reading of the past sees the newest slot too: never less
		{59*time.Minute + 29*time.Second, 123},
		{time.Hour, 123},                      // 60 min after: still counted (minute 60 keeps minute 0)
		{time.Hour + 29*time.Second, 123},     // the last second of minute 60
		{time.Hour + 30*time.Second, 23},      // minute 61: minute 0's bytes leave, 61 min after
		{70*time.Minute + 29*time.Second, 23}, // minute 70 still keeps minute 10
		{70*time.Minute + 30*time.Second, 3},
		{119*time.Minute + 30*time.Second, 0},
	} {
		if got := m.Total(at.Add(tt.dt)); got != tt.want {
			t.Fatalf("Total %v after the first bytes = %d, want %d", tt.dt, got, tt.want)
		}
	}
}

// Bytes moved at t count for at least an hour and less than an hour and a minute, wherever
// in its minute t falls.
func TestTrafficMeterWindowBounds(t *testing.T) {
	for _, off := range []time.Duration{0, time.Second, 30 * time.Second, 59*time.Second + 999*time.Millisecond} {
		var m TrafficMeter
		at := t0.Add(7*time.Minute + off)
		m.Add(1, at)
		if got := m.Total(at.Add(TrafficWindow)); got != 1 {
			t.Errorf("offset %v: bytes gone %v after, before the window's end", off, TrafficWindow)
		}
		if got := m.Total(at.Add(TrafficWindow + time.Minute)); got != 0 {
			t.Errorf("offset %v: bytes still counted %v after", off, TrafficWindow+time.Minute)
		}
	}
}

// A clock that goes backwards adds to the newest slot; a long gap clears everything;
// counts saturate.
func TestTrafficMeterEdges(t *testing.T) {
	var m TrafficMeter
	m.Add(10, t0.Add(5*time.Minute))
	m.Add(7, t0) // backwards: kept, in minute 5
	if got := m.Total(t0.Add(65 * time.Minute)); got != 17 {
		t.Fatalf("Total at minute 65 = %d, want 17 (the backwards bytes stay with minute 5)", got)
	}
	if got := m.Total(t0.Add(66 * time.Minute)); got != 0 {
		t.Fatalf("Total at minute 66 = %d, want 0", got)
	}

	m = TrafficMeter{}
	m.Add(1, t0)
	m.Add(2, t0.Add(1000*time.Hour))
	if got := m.Total(t0.Add(1000 * time.Hour)); got != 2 {
		t.Fatalf("Total after a long gap = %d, want 2", got)
	}

	m = TrafficMeter{}
	m.Add(math.MaxInt64-1, t0)
	m.Add(5, t0)
	m.Add(5, t0.Add(time.Minute))
	if got := m.Total(t0.Add(time.Minute)); got != math.MaxInt64 {
		t.Fatalf("Total = %d, want saturated at MaxInt64", got)
	}

	// Times before the Unix epoch fall in their own minutes too (the minute before it is not
	// minute 0).
	m = TrafficMeter{}
	old := time.Unix(-30, 0)
	m.Add(4, old)
	if got := m.Total(old.Add(TrafficWindow)); got != 4 {
		t.Fatalf("before the epoch: Total an hour on = %d, want 4", got)
	}
	if got := m.Total(old.Add(TrafficWindow + time.Minute)); got != 0 {
		t.Fatalf("before the epoch: Total an hour and a minute on = %d, want 0", got)
	}
}

// TestTrafficMeterModel: random adds and reads against the definition, a sum over every
// add still in the window (its minute no more than 60 minutes before the reading's).
func TestTrafficMeterModel(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 5))
	type add struct {
		minute int64
		n      int64
	}
	for trial := range 200 {
		var m TrafficMeter
		var adds []add
		now, newest := t0, int64(math.MinInt64)
		for i := range 400 {
			switch r.IntN(10) {
			case 0:
				now = now.Add(-time.Duration(r.IntN(120)) * time.Second) // backwards
			case 1:
				now = now.Add(time.Duration(r.IntN(180)) * time.Minute) // a long quiet spell
			default:
				now = now.Add(time.Duration(r.IntN(90)) * time.Second)
			}
			k := max(minuteOf(now), newest)
			if r.IntN(3) != 0 {
				n := r.Int64N(1 << 20)
				m.Add(n, now)
				newest = k
				adds = append(adds, add{k, n})
				continue
			}
			newest = k
			want := int64(0)
			for _, a := range adds {
				if a.minute >= newest-60 {
					want += a.n
				}
			}
			if got := m.Total(now); got != want {
				t.Fatalf("trial %d step %d: Total = %d, want %d", trial, i, got, want)
			}
		}
	}
}

func TestTrafficBreaches(t *testing.T) {
	p := mustProfile(t, ProfileStandard)
	if OverCap(p, math.MaxInt64) || TrafficBreaches(p, math.MaxInt64) != nil {
		t.Fatal("no cap (0) is reached by no traffic")
	}
	p.MaxBytesPerHour = 1000
	for _, tt := range []struct {
		lastHour int64
		want     bool
	}{{0, false}, {999, false}, {1000, true}, {5000, true}} {
		if got := OverCap(p, tt.lastHour); got != tt.want {
			t.Errorf("OverCap(cap 1000, %d) = %v, want %v", tt.lastHour, got, tt.want)
		}
		want := []Reason(nil)
		if tt.want {
			want = []Reason{ReasonBandwidthCap}
		}
		if got := TrafficBreaches(p, tt.lastHour); !slices.Equal(got, want) {
			t.Errorf("TrafficBreaches(cap 1000, %d) = %q, want %q", tt.lastHour, got, want)
		}
	}
}

// The governor pauses on the traffic cap like on any breach, after the device's breaches and
// even with silent sensors, and resumes when the window lets the count fall below the cap.
func TestGovernorTrafficCap(t *testing.T) {
	p := mustProfile(t, ProfileStandard)
	p.MaxBytesPerHour = 1000
	var m TrafficMeter
	g := NewGovernor(DefaultParams(hb))
	observe := func(c Conditions, at time.Time) State { return g.ObserveTraffic(p, c, true, m.Total(at), at) }
	if st := observe(healthy(), t0); !st.Accepting {
		t.Fatalf("under the cap: %+v", st)
	}
	m.Add(999, t0.Add(time.Second))
	if st := observe(healthy(), t0.Add(hb)); !st.Accepting {
		t.Fatalf("a byte under the cap: %+v, want accepting", st)
	}
	m.Add(1, t0.Add(20*time.Second))
	at := t0.Add(2 * hb)
	if st := observe(healthy(), at); st.Accepting || !slices.Equal(st.Reasons, []Reason{ReasonBandwidthCap}) {
		t.Fatalf("at the cap: %+v, want paused by bandwidth_cap", st)
	}
	metered := healthy()
	metered.Metered = true
	if st := observe(metered, at.Add(hb)); !slices.Equal(st.Reasons, []Reason{ReasonMetered, ReasonBandwidthCap}) {
		t.Fatalf("reasons = %q, want metered then bandwidth_cap", st.Reasons)
	}
	silent := Conditions{}
	if st := observe(silent, at.Add(2*hb)); !slices.Equal(st.Reasons, []Reason{ReasonSensorsSilent, ReasonBandwidthCap}) {
		t.Fatalf("reasons = %q, want sensors_silent then bandwidth_cap", st.Reasons)
	}
	// Every heartbeat within the hour stays paused; the first heartbeat after the bytes
	// left the window is healthy, and RecoverBeats of them resume.
	var beat time.Time
	healthyBeats := 0
	for beat = at.Add(3 * hb); healthyBeats < DefaultRecoverBeats; beat = beat.Add(hb) {
		st := observe(healthy(), beat)
		if m.Total(beat) >= p.MaxBytesPerHour {
			if st.Accepting || !slices.Equal(st.Reasons, []Reason{ReasonBandwidthCap}) {
				t.Fatalf("%v: over the cap, %+v", beat.Sub(t0), st)
			}
			continue
		}
		healthyBeats++
		if st.Accepting != (healthyBeats == DefaultRecoverBeats) {
			t.Fatalf("%v: healthy beat %d, accepting %v", beat.Sub(t0), healthyBeats, st.Accepting)
		}
	}
	if resumed := beat.Add(-hb).Sub(t0); resumed < TrafficWindow || resumed > TrafficWindow+time.Minute+DefaultRecoverBeats*hb {
		t.Fatalf("resumed %v after the bytes, want an hour, to the minute, plus the recovery", resumed)
	}
}

// Step keeps no alias of the caller's breaches.
func TestGovernorStepCopies(t *testing.T) {
	g := NewGovernor(DefaultParams(hb))
	br := []Reason{ReasonBandwidthCap}
	g.Step(br, t0)
	br[0] = "changed"
	if st := g.State(); !slices.Equal(st.Reasons, []Reason{ReasonBandwidthCap}) {
		t.Fatalf("State().Reasons = %q after the caller changed its slice", st.Reasons)
	}
}
