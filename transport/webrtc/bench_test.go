package webrtc

import (
	"context"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// B4: WebRTC data channels against libp2p streams between the same two hosts, and the
// costs of a set-up and of a warm dispatch on an emulated 10 ms RTT path.
//
//	go test -run='^$' -bench=B4 -benchtime=300x ./transport/webrtc/
//
// Goals: warm rtt_ratio ≤ 2.5 (floor 3); at 10 ms RTT cold set-up ≤ 6 RTT + 10 ms, warm
// dispatch ≤ 1 RTT + 0.5 ms, warm ping-pong ≤ 1.05 × RTT. vnet's router itself adds a few
// hundred µs to each packet's 5 ms, so the warm figures are also given against a bare UDP
// ping-pong over the same path (udp_rtt_ms, dispatch_over_udp_ms, pingpong_vs_udp).

const pingSize = 64

const benchPingID = protocol.ID("/meshinfer/bench-ping/1.0.0")

// pong answers each pingSize message with itself until the stream ends.
func pong(rw io.ReadWriter) {
	buf := make([]byte, pingSize)
	for {
		if _, err := io.ReadFull(rw, buf); err != nil {
			return
		}
		if _, err := rw.Write(buf); err != nil {
			return
		}
	}
}

func pongStream(_ peer.ID, s Stream) {
	pong(s)
	s.Close()
}

// ping makes one round trip of pingSize bytes.
func ping(b *testing.B, rw io.ReadWriter, buf []byte) time.Duration {
	start := time.Now()
	if _, err := rw.Write(buf); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(rw, buf); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// udpPinger answers UDP on the vnet path's far end and returns a function making one
// pingSize round trip from the near end.
func udpPinger(b *testing.B, path *vnetPath) func([]byte) time.Duration {
	far, err := path.nb.ListenPacket("udp4", "1.2.3.5:9")
	if err != nil {
		b.Fatal(err)
	}
	near, err := path.na.ListenPacket("udp4", "1.2.3.4:9")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { // ends when far is closed
		defer close(done)
		buf := make([]byte, pingSize)
		for {
			n, from, err := far.ReadFrom(buf)
			if err != nil {
				return
			}
			far.WriteTo(buf[:n], from)
		}
	}()
	b.Cleanup(func() {
		near.Close()
		far.Close()
		<-done
	})
	to := far.LocalAddr()
	return func(buf []byte) time.Duration {
		start := time.Now()
		if _, err := near.WriteTo(buf, to); err != nil {
			b.Fatal(err)
		}
		if _, _, err := near.ReadFrom(buf); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
}

func perOp(total time.Duration, n int) time.Duration { return total / time.Duration(n) }

func BenchmarkB4(b *testing.B) {
	b.Run("warm_rtt_loopback", benchWarmRTT)
	b.Run("cold_setup_loopback", benchColdLoopback)
	b.Run("vnet_10ms", benchVnet)
}

// interleavedRTT warms x and y with 100 ping-pongs each, then times b.N ops of pingsPerOp
// interleaved pairs (so a ratio rests on enough samples even at the small -benchtime the
// vnet set-ups need) and returns the mean round trip of each.
func interleavedRTT(b *testing.B, x, y io.ReadWriter) (xRTT, yRTT time.Duration) {
	buf := make([]byte, pingSize)
	for range 100 {
		ping(b, x, buf)
		ping(b, y, buf)
	}
	const pingsPerOp = 20
	var xt, yt time.Duration
	b.ResetTimer()
	for range b.N {
		for range pingsPerOp {
			xt += ping(b, x, buf)
			yt += ping(b, y, buf)
		}
	}
	b.StopTimer()
	return perOp(xt, b.N*pingsPerOp), perOp(yt, b.N*pingsPerOp)
}

// Warm round trip: a 64 B ping-pong on a warm data channel, interleaved with one on a warm
// libp2p stream (TCP loopback, yamux) between the same hosts.
func benchWarmRTT(b *testing.B) {
	p := newPair(b, Config{}, Config{})
	p.b.SetStreamHandler(pongStream)
	p.hb.SetStreamHandler(benchPingID, func(st network.Stream) {
		pong(st)
		st.Close()
	})
	ctx := context.Background()
	dc, _, err := p.a.OpenStream(ctx, p.hb.ID())
	if err != nil {
		b.Fatal(err)
	}
	defer dc.Close()
	ls, err := p.ha.NewStream(ctx, p.hb.ID(), benchPingID)
	if err != nil {
		b.Fatal(err)
	}
	defer ls.Close()
	dcRTT, lpRTT := interleavedRTT(b, dc, ls)
	b.ReportMetric(float64(dcRTT.Nanoseconds())/1e3, "dc_rtt_us")
	b.ReportMetric(float64(lpRTT.Nanoseconds())/1e3, "libp2p_rtt_us")
	b.ReportMetric(float64(dcRTT)/float64(lpRTT), "rtt_ratio")
}

// Cold set-up on loopback: OpenStream on a fresh Transport pair, in ms and in loopback
// libp2p round trips.
func benchColdLoopback(b *testing.B) {
	ha, hb := newHost(b), newHost(b)
	connect(b, ha, hb)
	hb.SetStreamHandler(benchPingID, func(st network.Stream) {
		pong(st)
		st.Close()
	})
	ls, err := ha.NewStream(context.Background(), hb.ID(), benchPingID)
	if err != nil {
		b.Fatal(err)
	}
	defer ls.Close()
	buf := make([]byte, pingSize)
	var lpTotal time.Duration
	for range 200 {
		lpTotal += ping(b, ls, buf)
	}
	rtt := perOp(lpTotal, 200)
	cold, p50 := coldSetups(b, ha, hb, Config{}, Config{Accept: true})
	b.ReportMetric(float64(cold.Microseconds())/1e3, "cold_ms")
	b.ReportMetric(float64(p50.Microseconds())/1e3, "cold_p50_ms")
	b.ReportMetric(float64(cold)/float64(rtt), "cold_rtts")
	b.ReportMetric(float64(rtt.Nanoseconds())/1e3, "libp2p_rtt_us")
}

// coldSetups times b.N cold OpenStream calls, each on a fresh Transport pair on ha and hb,
// and returns their mean and median. The mean includes the set-ups where pion's ICE agent
// nominates on its next 200 ms check tick rather than at once.
func coldSetups(b *testing.B, ha, hb host.Host, ca, cb Config) (mean, median time.Duration) {
	var total time.Duration
	all := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		ta, err := New(ha, ca)
		if err != nil {
			b.Fatal(err)
		}
		tb, err := New(hb, cb)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		s, warm, err := ta.OpenStream(context.Background(), hb.ID())
		d := time.Since(start)
		total += d
		all = append(all, d)
		b.StopTimer()
		if err != nil || warm {
			b.Fatalf("cold open: warm %v, %v", warm, err)
		}
		s.Close()
		ta.Close()
		tb.Close()
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(all)
	return perOp(total, b.N), all[len(all)/2]
}

// At an emulated 10 ms RTT (vnet, 5 ms each way; signaling on real loopback): cold set-up,
// warm dispatch (a new stream on a warm PeerConnection plus one ping-pong) and warm
// ping-pong, each in RTTs.
func benchVnet(b *testing.B) {
	const rtt = 10 * time.Millisecond
	b.Run("cold", func(b *testing.B) {
		path := newVnetPath(b, rtt/2)
		ha, hb := newHost(b), newHost(b)
		connect(b, ha, hb)
		cold, p50 := coldSetups(b, ha, hb, Config{SettingEngine: path.a}, Config{SettingEngine: path.b, Accept: true})
		b.ReportMetric(float64(cold.Microseconds())/1e3, "cold_ms")
		b.ReportMetric(float64(p50.Microseconds())/1e3, "cold_p50_ms")
		b.ReportMetric(float64(cold)/float64(rtt), "cold_rtts")
		b.ReportMetric(float64(cold-6*rtt)/float64(time.Millisecond), "cold_over_6rtt_ms")
	})
	b.Run("warm", func(b *testing.B) {
		path := newVnetPath(b, rtt/2)
		udp := udpPinger(b, path)
		p := newPair(b, Config{SettingEngine: path.a}, Config{SettingEngine: path.b})
		p.b.SetStreamHandler(pongStream)
		ctx := context.Background()
		s, _, err := p.a.OpenStream(ctx, p.hb.ID())
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		buf := make([]byte, pingSize)
		for range 10 {
			ping(b, s, buf)
		}
		var dispatch, pingPong, udpRTT time.Duration
		b.ResetTimer()
		for range b.N {
			udpRTT += udp(buf)
			start := time.Now()
			ns, warm, err := p.a.OpenStream(ctx, p.hb.ID())
			if err != nil || !warm {
				b.Fatalf("warm open: warm %v, %v", warm, err)
			}
			ping(b, ns, buf)
			dispatch += time.Since(start)
			ns.Close()
			pingPong += ping(b, s, buf)
		}
		b.StopTimer()
		d, pp, bare := perOp(dispatch, b.N), perOp(pingPong, b.N), perOp(udpRTT, b.N)
		b.ReportMetric(float64(d.Microseconds())/1e3, "dispatch_ms")
		b.ReportMetric(float64(d)/float64(rtt), "dispatch_rtts")
		b.ReportMetric(float64(pp.Microseconds())/1e3, "pingpong_ms")
		b.ReportMetric(float64(pp)/float64(rtt), "pingpong_ratio")
		// The emulated path's own round trip (vnet's router adds a few hundred µs per
		// hop to the 5 ms delay), measured with a bare UDP ping-pong interleaved.
		b.ReportMetric(float64(bare.Microseconds())/1e3, "udp_rtt_ms")
		b.ReportMetric(float64((d-bare).Microseconds())/1e3, "dispatch_over_udp_ms")
		b.ReportMetric(float64(pp)/float64(bare), "pingpong_vs_udp")
	})
}
