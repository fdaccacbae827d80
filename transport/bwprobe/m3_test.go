package bwprobe

import (
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/frame"
)

const mbit = 1e6 / 8 // bytes per second in 1 Mbit/s

// m3Phases are the rates the M3 figure shapes, one phase after another: the estimate must
// be within m3Tolerance of a phase's rates after its transfers (two for the first, three
// after each change). The changes go both ways, by 6× to 40×.
var m3Phases = []struct {
	down, up  float64 // bytes per second, as this node sees them
	transfers int
}{
	{down: 50 * mbit, up: 20 * mbit, transfers: 2},
	{down: 8 * mbit, up: 100 * mbit, transfers: 3},
	{down: 200 * mbit, up: 5 * mbit, transfers: 3},
}

const (
	m3Tolerance = 0.25
	// m3Latency is the one-way delay of the shaped links: a round trip (40 ms) as long as
	// a 512 KiB transfer at 100 Mbit/s, so that timing the latency with the transfer
	// would miss the figure by far.
	m3Latency = 20 * time.Millisecond
	m3Jitter  = 0.3 // each chunk's time on the wire ±30 %
)

// rate is a rate the test changes between transfers while a link's writer reads it.
type rate struct{ bits atomic.Uint64 }

func (r *rate) set(bps float64) { r.bits.Store(math.Float64bits(bps)) }
func (r *rate) get() float64    { return math.Float64frombits(r.bits.Load()) }

func checkWithin(t *testing.T, what string, got, want float64) {
	t.Helper()
	if off := math.Abs(got-want) / want; off > m3Tolerance {
		t.Errorf("%s: estimate %.1f Mbit/s, shaped %.1f Mbit/s: %.0f %% off, more than %.0f %%",
			what, got/mbit, want/mbit, 100*off, 100*m3Tolerance)
	}
}

// Figure M3 (issue 17), from probes: over a link shaped in user space (a rate each way, a
// 20 ms one-way delay, ±30 % jitter per chunk) on virtual time, the estimate of each
// direction is within 25 % of the shaped rate after two probes, and within 25 % of a new
// rate three probes after it changed. The server's own estimate of the client's upload
// follows too. Probes come a ProbeInterval apart, as a client sends them.
func TestM3ProbesFollowShapedRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down, up rate
		cest, sest := bandwidth.New(), bandwidth.New()
		c := NewClient(nil, cest)
		s := newServer(sest)
		defer s.Close()
		client, server := peer.ID("client"), peer.ID("server")
		seed := uint64(1)
		for i, ph := range m3Phases {
			down.set(ph.down)
			up.set(ph.up)
			for k := range ph.transfers {
				a, b := newLink(up.get, down.get, m3Latency, m3Jitter, seed)
				seed += 2
				served := make(chan error, 1)
				go func() { served <- s.serve(client, b) }()
				res, err := c.exchange(a, server)
				if err != nil {
					t.Fatalf("phase %d probe %d: %v", i, k, err)
				}
				if err := <-served; err != nil {
					t.Fatalf("phase %d probe %d: server: %v", i, k, err)
				}
				est, _ := cest.Get(server.String())
				t.Logf("phase %d probe %d: rtt %v; down %.1f → estimate %.1f Mbit/s; up %.1f → %.1f Mbit/s",
					i, k+1, res.RTT, ph.down/mbit, est.Down.BytesPerSec/mbit, ph.up/mbit, est.Up.BytesPerSec/mbit)
				time.Sleep(ProbeInterval)
			}
			est, _ := cest.Get(server.String())
			checkWithin(t, "down", est.Down.BytesPerSec, ph.down)
			checkWithin(t, "up", est.Up.BytesPerSec, ph.up)
			sst, _ := sest.Get(client.String())
			checkWithin(t, "the server's down (the client's up)", sst.Down.BytesPerSec, ph.up)
		}
	})
}

// Figure M3, from the transfers a node makes anyway: stage prefill batches (frames of
// 256 KiB: synth-base's 512-wide hidden states for 128 positions) on one stream over the
// same shaped link, a stage's 50 ms of layers between them, each timed by a Meter under
// the frame reader. Two frames put the estimate within 25 % of the shaped rate, three
// after a change put it within 25 % of the new one.
func TestM3PrefillFramesFollowShapedRate(t *testing.T) {
	const frameBytes = 256 << 10
	synctest.Test(t, func(t *testing.T) {
		var r rate
		r.set(m3Phases[0].down)
		a, b := newLink(r.get, r.get, m3Latency, m3Jitter, 7)
		next := make(chan bool)
		sent := make(chan error, 1)
		go func() { // the previous hop: a frame each time it is told to, until told to stop
			body := make([]byte, frameBytes)
			for <-next {
				time.Sleep(50 * time.Millisecond) // its layers
				if err := frame.Write(a, body); err != nil {
					sent <- err
					return
				}
			}
			sent <- nil
		}()
		est := bandwidth.New()
		m := bandwidth.NewMeter(b)
		fr := frame.NewReader(m, frameBytes)
		for i, ph := range m3Phases {
			r.set(ph.down)
			for k := range ph.transfers {
				m.Take() // nothing but the next frame counts
				next <- true
				if _, err := fr.Next(); err != nil {
					t.Fatalf("phase %d frame %d: %v", i, k, err)
				}
				tr := m.Take()
				if !est.Observe("prev", tr, time.Now()) {
					t.Fatalf("phase %d frame %d: %+v is no sample", i, k, tr)
				}
				got, _ := est.Get("prev")
				t.Logf("phase %d frame %d: shaped %.1f, estimate %.1f Mbit/s", i, k+1, ph.down/mbit, got.Down.BytesPerSec/mbit)
			}
			got, _ := est.Get("prev")
			checkWithin(t, "down", got.Down.BytesPerSec, ph.down)
		}
		next <- false
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
	})
}
