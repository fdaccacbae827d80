package bwprobe

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/meshinfer/meshinfer/internal/bandwidth"
)

// pacer lets bytes pass at a rate, in real time: each chunk waits until the ones before
// it would have crossed a link of that rate. It keeps to its schedule when a sleep
// overshoots (the next chunk goes sooner), so that the rate holds on a busy machine; a
// link idle for pacerIdle starts a new schedule.
type pacer struct {
	rate float64 // bytes per second
	mu   sync.Mutex
	next time.Time
}

const pacerIdle = 10 * time.Millisecond

func (p *pacer) wait(n int) {
	p.mu.Lock()
	now := time.Now()
	if now.Sub(p.next) > pacerIdle {
		p.next = now
	}
	p.next = p.next.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
	until := p.next
	p.mu.Unlock()
	time.Sleep(time.Until(until))
}

// shapedStream is a server's libp2p stream shaped in user space: what it writes leaves at
// down's rate, what it reads is taken at up's (so the client's upload, held back by the
// stream's flow control, crosses at that rate).
type shapedStream struct {
	network.Stream
	down, up *pacer
}

func (s shapedStream) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), linkChunk)
		s.down.wait(k)
		m, err := s.Stream.Write(p[:k])
		n += m
		if err != nil {
			return n, err
		}
		p = p[k:]
	}
	return n, nil
}

func (s shapedStream) Read(p []byte) (int, error) {
	n, err := s.Stream.Read(p[:min(len(p), linkChunk)])
	if n > 0 {
		s.up.wait(n)
	}
	return n, err
}

// BenchmarkM3Probe is figure M3 on real libp2p hosts (loopback, yamux over TCP) with the
// server's stream shaped in user space: the estimate after two probes, each way, as a
// ratio to the shaped rate (goal: within 0.75-1.25). Each iteration starts a fresh
// estimate. The client's and server's rate limits are left out (exchanges are run
// directly), so that iterations follow each other at once.
func BenchmarkM3Probe(b *testing.B) {
	for _, mbps := range []float64{20, 100} {
		b.Run(fmt.Sprintf("%.0fMbit", mbps), func(b *testing.B) {
			rate := mbps * mbit
			ch, sh := newHost(b), newHost(b)
			connect(b, ch, sh)
			sh.SetStreamHandler(ID, func(st network.Stream) {
				// A server per probe: its own limits would refuse the next one.
				if err := newServer(nil).serve(st.Conn().RemotePeer(), shapedStream{st, &pacer{rate: rate}, &pacer{rate: rate}}); err != nil {
					st.Reset()
					return
				}
				st.Close()
			})
			var down, up float64
			for b.Loop() {
				c := NewClient(ch, bandwidth.New())
				for range 2 {
					st, err := ch.NewStream(b.Context(), sh.ID(), ID)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := c.exchange(st, sh.ID()); err != nil {
						b.Fatal(err)
					}
					st.Close()
				}
				est, _ := c.est.Get(sh.ID().String())
				down += est.Down.BytesPerSec / rate
				up += est.Up.BytesPerSec / rate
			}
			b.ReportMetric(down/float64(b.N), "down/shaped")
			b.ReportMetric(up/float64(b.N), "up/shaped")
		})
	}
}
