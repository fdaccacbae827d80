package bandwidth

import (
	"fmt"
	"io"
	"math"
	"testing"
	"testing/synctest"
	"time"
)

func TestTransferRate(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name string
		t    Transfer
		want float64 // bytes/s; 0: no sample
	}{
		{"a link-paced transfer", Transfer{Bytes: mib, Timed: mib - 4096, Dur: time.Second, Waited: 900 * time.Millisecond}, mib - 4096},
		{"up, timed whole", Transfer{Dir: Up, Bytes: mib, Timed: mib, Dur: 2 * time.Second, Waited: 2 * time.Second}, mib / 2},
		{"just MinBytes", Transfer{Bytes: MinBytes, Timed: MinBytes - 1024, Dur: time.Millisecond, Waited: time.Millisecond}, (MinBytes - 1024) * 1000},
		{"waited exactly half", Transfer{Bytes: mib, Timed: mib, Dur: time.Second, Waited: 500 * time.Millisecond}, mib},
		{"under MinBytes", Transfer{Bytes: MinBytes - 1, Timed: MinBytes - 100, Dur: time.Millisecond, Waited: time.Millisecond}, 0},
		{"arrived whole before the first read", Transfer{Bytes: mib, Timed: 0, Dur: 0}, 0},
		{"no time", Transfer{Bytes: mib, Timed: mib / 2, Dur: 0}, 0},
		{"paced by the reader", Transfer{Bytes: mib, Timed: mib, Dur: time.Second, Waited: 499 * time.Millisecond}, 0},
		{"faster than any link", Transfer{Bytes: mib, Timed: mib, Dur: time.Nanosecond, Waited: time.Nanosecond}, 0},
		{"no direction", Transfer{Dir: 7, Bytes: mib, Timed: mib, Dur: time.Second, Waited: time.Second}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.t.Rate()
			if ok != (tc.want > 0) || math.Abs(got-tc.want) > 1e-6*tc.want {
				t.Fatalf("Rate() = %v, %v; want %v (a sample: %v)", got, ok, tc.want, tc.want > 0)
			}
		})
	}
}

// trickle writes total bytes to w in chunks, the first after delay and one every
// chunk/rate after that: a link of that rate and latency, as its receiver sees it.
func trickle(w io.Writer, total, chunk int, rate float64, delay time.Duration) error {
	time.Sleep(delay)
	buf := make([]byte, chunk)
	for sent := 0; sent < total; sent += chunk {
		if sent > 0 {
			time.Sleep(time.Duration(float64(chunk) / rate * float64(time.Second)))
		}
		if _, err := w.Write(buf[:min(chunk, total-sent)]); err != nil {
			return err
		}
	}
	return nil
}

// The Meter times a transfer from its first byte to its last: the latency before the first
// byte is left out, and so are the bytes of the first read. A transfer that was all there
// at the first read has no time, and one the reader paced is dropped.
func TestMeter(t *testing.T) {
	const (
		total = 256 << 10
		chunk = 16 << 10
		rate  = 10e6 / 8 // 10 Mbit/s
	)
	read := func(r io.Reader, between time.Duration) error {
		buf := make([]byte, 32<<10)
		for {
			if _, err := r.Read(buf); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
			time.Sleep(between)
		}
	}
	t.Run("link-paced, after a long latency", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(trickle(pw, total, chunk, rate, 300*time.Millisecond)) }()
			m := NewMeter(pr)
			if err := read(m, 0); err != nil {
				t.Fatal(err)
			}
			tr := m.Take()
			want := Transfer{Dir: Down, Bytes: total, Timed: total - chunk, Dur: 15 * time.Duration(float64(chunk)/rate*float64(time.Second))}
			want.Waited = want.Dur
			if tr != want {
				t.Fatalf("transfer %+v, want %+v", tr, want)
			}
			if got, ok := tr.Rate(); !ok || math.Abs(got-rate) > 1e-6*rate {
				t.Fatalf("rate %v (a sample: %v), want %v: the latency before the first byte must not count", got, ok, rate)
			}
			if again := m.Take(); again != (Transfer{Dir: Down}) {
				t.Fatalf("a second Take: %+v, want nothing read", again)
			}
		})
	})
	t.Run("paced by the reader", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(trickle(pw, total, chunk, rate, 0)) }()
			m := NewMeter(pr)
			// The reader works 4× longer on each chunk than the link takes to bring the
			// next: the bytes wait for it.
			if err := read(m, 4*time.Duration(float64(chunk)/rate*float64(time.Second))); err != nil {
				t.Fatal(err)
			}
			tr := m.Take()
			if tr.Bytes != total || tr.Dur == 0 {
				t.Fatalf("transfer %+v, want %d bytes over some time", tr, total)
			}
			if r, ok := tr.Rate(); ok {
				t.Fatalf("a reader-paced transfer (waited %v of %v) is a sample of %v B/s", tr.Waited, tr.Dur, r)
			}
		})
	})
	t.Run("there whole at the first read", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(trickle(pw, total, total, rate, time.Second)) }()
			m := NewMeter(pr)
			if _, err := io.ReadFull(m, make([]byte, total)); err != nil {
				t.Fatal(err)
			}
			tr := m.Take()
			if r, ok := tr.Rate(); ok || tr.Timed != 0 {
				t.Fatalf("transfer %+v read in one go is a sample of %v B/s", tr, r)
			}
		})
	})
}

// Each sample moves the estimate as the package doc says: the first sets it, one right
// after keeps PastWeight of the old (in logarithms), one after a long silence counts
// almost alone, and the two directions are apart.
func TestEstimatorMix(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sample := func(dir Direction, bps float64) Transfer {
		return Transfer{Dir: dir, Bytes: 1 << 20, Timed: 1 << 20, Dur: time.Duration(float64(1<<20) / bps * float64(time.Second)), Waited: time.Hour}
	}
	type step struct {
		at       time.Duration // after start
		dir      Direction
		bps      float64
		wantDown float64
		wantUp   float64
	}
	geo := func(old, new float64, w float64) float64 { return math.Exp(w*math.Log(old) + (1-w)*math.Log(new)) }
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first sample sets the estimate", []step{{0, Down, 1e6, 1e6, 0}}},
		{"back to back", []step{{0, Down, 1e6, 1e6, 0}, {0, Down, 4e6, geo(1e6, 4e6, PastWeight), 0}}},
		{"one half-life apart", []step{{0, Down, 1e6, 1e6, 0}, {HalfLife, Down, 4e6, geo(1e6, 4e6, PastWeight/2), 0}}},
		{"an hour apart", []step{{0, Down, 1e6, 1e6, 0}, {time.Hour, Down, 4e6, geo(1e6, 4e6, PastWeight*math.Exp2(-30)), 0}}},
		{"an older sample counts as taken with the estimate", []step{{time.Hour, Down, 1e6, 1e6, 0}, {0, Down, 4e6, geo(1e6, 4e6, PastWeight), 0}}},
		{"directions apart", []step{{0, Down, 1e6, 1e6, 0}, {0, Up, 8e6, 1e6, 8e6}, {0, Up, 2e6, 1e6, geo(8e6, 2e6, PastWeight)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New()
			for i, s := range tc.steps {
				if !e.Observe("p", sample(s.dir, s.bps), start.Add(s.at)) {
					t.Fatalf("step %d: not a sample", i)
				}
				got, ok := e.Get("p")
				if !ok || !near(got.Down.BytesPerSec, s.wantDown) || !near(got.Up.BytesPerSec, s.wantUp) {
					t.Fatalf("step %d: estimate %+v, want down %v up %v", i, got, s.wantDown, s.wantUp)
				}
			}
		})
	}
	e := New()
	if e.Observe("p", Transfer{Bytes: 10}, start) {
		t.Fatal("a 10-byte transfer was taken as a sample")
	}
	if _, ok := e.Get("p"); ok {
		t.Fatal("a transfer that is no sample made an entry")
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) }

// The downlink is the lower median of the recent Down estimates; Up estimates and old
// ones do not count; 0 without any.
func TestEstimatorDownlink(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	down := func(bps float64) Transfer {
		return Transfer{Bytes: 1 << 20, Timed: 1 << 20, Dur: time.Duration(float64(1<<20) / bps * float64(time.Second)), Waited: time.Hour}
	}
	e := New()
	if got := e.Downlink(now); got != 0 {
		t.Fatalf("downlink %v with nothing measured, want 0", got)
	}
	e.Observe("old", down(1e9), now.Add(-Recent-time.Second))
	up := down(1e9)
	up.Dir = Up
	e.Observe("up only", up, now)
	if got := e.Downlink(now); got != 0 {
		t.Fatalf("downlink %v from an old and an Up estimate, want 0", got)
	}
	for i, bps := range []float64{4e6, 1e6, 2e6, 8e6} {
		e.Observe(fmt.Sprint("p", i), down(bps), now.Add(-time.Minute))
		want := []float64{4e6, 1e6, 2e6, 2e6}[i] // lower median of those so far
		if got := e.Downlink(now); !near(got, want) {
			t.Fatalf("after %d peers: downlink %v, want %v", i+1, got, want)
		}
	}
}

// The estimator keeps MaxPeers peers and forgets the one measured least recently.
func TestEstimatorBounded(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := Transfer{Bytes: 1 << 20, Timed: 1 << 20, Dur: time.Second, Waited: time.Second}
	e := New()
	for i := range MaxPeers {
		at := now.Add(time.Duration(i) * time.Second)
		if i == 0 {
			at = now.Add(time.Hour) // the first peer is the most recent
		}
		e.Observe(fmt.Sprint("p", i), tr, at)
	}
	e.Observe("new", tr, now.Add(2*time.Hour))
	if len(e.peers) != MaxPeers {
		t.Fatalf("%d peers kept, want %d", len(e.peers), MaxPeers)
	}
	for _, p := range []string{"p0", "p2", "new"} {
		if _, ok := e.Get(p); !ok {
			t.Fatalf("%s forgotten", p)
		}
	}
	if _, ok := e.Get("p1"); ok {
		t.Fatal("p1, measured least recently, still kept")
	}
}
