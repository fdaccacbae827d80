package stage

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
)

// Benchmarks of the sharding issue's S1, S2 and S3, each measured against its reference in
// the same run, interleaved (docs/benchmarks.md §7.1). For S1 and S2 the model is arith at
// width 4096 (a 7B model's d_model: 16 KiB of hidden states per decode step) with 4 cheap
// layers, so that what is measured is the chain, not the layers; S3 runs inference/synth's
// synth-base, whose prefill is the work being split.
const (
	benchLayers = 4
	benchWidth  = 4096
	// benchPositions is each session's length; a benchmark opens new sessions as they fill.
	benchPositions = 4096
)

// stepper is a session of layers that a benchmark runs decode steps through, reopened
// (outside the timing) when its positions are used up.
type stepper struct {
	name  string
	open  func() (inference.Layers, func())
	run   inference.Layers
	close func()
	used  int
	took  []time.Duration // per timed step
}

func (s *stepper) step(b *testing.B, x []float32) {
	if s.run == nil || s.used == benchPositions {
		if s.close != nil {
			s.close()
		}
		s.run, s.close = s.open()
		s.used = 0
	}
	began := time.Now()
	if _, err := s.run(b.Context(), x, 1); err != nil {
		b.Fatalf("%s: %v", s.name, err)
	}
	s.took = append(s.took, time.Since(began))
	s.used++
}

// median is the median of xs in microseconds: robust to the scheduler's hiccups on a
// shared machine, which a mean is not.
func median(xs []time.Duration) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return float64(s[len(s)/2].Nanoseconds()) / 1e3
}

// medianRatio is the median of a[i] ÷ b[i], op by op.
func medianRatio(a, b []time.Duration) float64 {
	r := make([]float64, len(a))
	for i := range a {
		r[i] = float64(a[i]) / float64(b[i])
	}
	slices.Sort(r)
	return r[len(r)/2]
}

// diffs is a[i] − b[i], step by step.
func diffs(a, b []time.Duration) []time.Duration {
	d := make([]time.Duration, len(a))
	for i := range a {
		d[i] = a[i] - b[i]
	}
	return d
}

func localStepper(b *testing.B) *stepper {
	be := newArith(benchLayers, benchWidth, 1)
	return &stepper{name: "one process", open: func() (inference.Layers, func()) {
		ss, err := be.OpenStage(b.Context(), arithModel, 0, benchLayers, benchPositions)
		if err != nil {
			b.Fatal(err)
		}
		return ss.Forward, func() { ss.Close() }
	}}
}

func chainStepper(b *testing.B, name string, c chain, opts ...PipelineOption) *stepper {
	return &stepper{name: name, open: func() (inference.Layers, func()) {
		p := c.open(b, benchPositions, opts...)
		return p.Forward, func() { p.Close() }
	}}
}

// BenchmarkS1BoundaryCost: S1, the cost of one stage boundary per decode step on loopback
// (goal ≤ 0.3 ms). A 2-stage chain and a 1-stage chain run the same layers with the same
// head: their difference is one stage-to-stage crossing (boundary-µs). Reported beside it:
// one crossing of the 1-stage chain over one process (its two crossings, head → stage and
// stage → head, halved: crossing-µs) and each path's time per step. The paths take turns
// step by step, and every figure is a median over the steps (of the step-by-step
// differences for boundary and crossing).
func BenchmarkS1BoundaryCost(b *testing.B) {
	in := localStepper(b)
	one := chainStepper(b, "1 stage", newChain(b, benchLayers, benchWidth, [][2]int{{0, benchLayers}}))
	two := chainStepper(b, "2 stages", newChain(b, benchLayers, benchWidth, [][2]int{{0, benchLayers / 2}, {benchLayers / 2, benchLayers}}))
	x := promptStates(1, benchWidth)
	for _, s := range []*stepper{in, one, two} { // warm up: sessions open, buffers grown
		for range 20 {
			s.step(b, x)
		}
		s.took = s.took[:0]
	}
	b.ResetTimer()
	for range b.N {
		in.step(b, x)
		one.step(b, x)
		two.step(b, x)
	}
	b.StopTimer()
	for _, s := range []*stepper{in, one, two} {
		s.close()
	}
	b.ReportMetric(median(in.took), "local-µs/step")
	b.ReportMetric(median(one.took), "1stage-µs/step")
	b.ReportMetric(median(two.took), "2stage-µs/step")
	b.ReportMetric(median(diffs(two.took, one.took)), "boundary-µs")
	b.ReportMetric(median(diffs(one.took, in.took))/2, "crossing-µs")
	b.ReportMetric(median(two.took)/median(in.took), "2stage/local")
}

// BenchmarkS2DelayPerHop: S2, the time a decode step adds at 10 ms one-way delay per hop
// (goal ≤ stages × delay + 1 ms: one one-way delay per boundary plus the return, never a
// round trip per stage). The delay is injected in user space (kernel netem is not
// available): every stage but the first listens behind a delayProxy, and the head and the
// stages know those stages only by their proxy's address (stage i learns stage i+1's from
// the open frame), so the connections stage i → stage i+1 and head → last stage (the
// return stream) each cross a proxy; the head runs beside stage 0, on a link without delay,
// as a head that holds the embeddings next to the first layers does. The same chain is
// measured with the proxies' delay at 0 and at 10 ms, alternating step by step: added-ms is
// the median of the step-by-step differences, budget-ms the goal, and added/budget their
// ratio.
//
// The proxy's timers fire late on a busy machine (by a fraction of a millisecond to a few,
// on 2 shared cores), which the chain's figure includes. So the one-way delay the proxy
// really imposes is measured in the same run, interleaved: half the added round-trip time
// of 16 KiB echoed through a proxy at the same delay (oneway-ms, a median too). added/(k·oneway) is then
// the chain's cost in one-way delays per stage: 1 is one one-way delay per hop and nothing
// else, and a round trip per stage would be about 2.
func BenchmarkS2DelayPerHop(b *testing.B) {
	const delay = 10 * time.Millisecond
	for _, k := range []int{2, 3} {
		b.Run(fmt.Sprintf("stages=%d", k), func(b *testing.B) {
			c := chain{head: newHost(b)}
			var proxies []*delayProxy
			for i := range k {
				n := newStage(b, newArith(benchLayers, benchWidth, 2))
				addrs := n.h.Addrs()
				if i > 0 {
					px := newDelayProxy(b, n.h.Addrs())
					proxies = append(proxies, px)
					addrs = []ma.Multiaddr{px.addr}
				}
				c.head.Peerstore().AddAddrs(n.h.ID(), addrs, peerstore.PermanentAddrTTL)
				c.stages = append(c.stages, n)
				c.hops = append(c.hops, Hop{Peer: n.h.ID(), Lo: i * benchLayers / k, Hi: (i + 1) * benchLayers / k})
			}
			p := c.open(b, benchPositions)
			defer p.Close()
			setDelay := func(d time.Duration) {
				for _, px := range proxies {
					px.delay.Store(int64(d))
				}
			}
			echo := newEchoLink(b, 4*benchWidth)
			x := promptStates(1, benchWidth)
			var fast, slow, echoFast, echoSlow []time.Duration // per step
			step := func(d time.Duration) time.Duration {
				setDelay(d)
				began := time.Now()
				if _, err := p.Forward(b.Context(), x, 1); err != nil {
					b.Fatal(err)
				}
				return time.Since(began)
			}
			step(delay) // warm up: the delayed links' windows and buffers
			step(0)
			b.ResetTimer()
			for i := range b.N {
				if i >= benchPositions/2-2 {
					b.Fatal("the session is full: run fewer steps (-benchtime=Nx)")
				}
				fast = append(fast, step(0))
				slow = append(slow, step(delay))
				echoFast = append(echoFast, echo.roundTrip(b, 0))
				echoSlow = append(echoSlow, echo.roundTrip(b, delay))
			}
			b.StopTimer()
			added, oneway := median(diffs(slow, fast))/1e3, median(diffs(echoSlow, echoFast))/2e3
			budget := float64(k)*float64(delay.Microseconds())/1e3 + 1
			b.ReportMetric(median(fast)/1e3, "undelayed-ms/step")
			b.ReportMetric(added, "added-ms")
			b.ReportMetric(budget, "budget-ms")
			b.ReportMetric(added/budget, "added/budget")
			b.ReportMetric(oneway, "oneway-ms")
			b.ReportMetric(added/(float64(k)*oneway), "added/(k·oneway)")
		})
	}
}

// BenchmarkS3PrefillThreeStages: S3, a 512-token prompt's prefill through 3 stages over
// the network ÷ the same prefill on a single node's backend (goal ≤ 1.1: the prompt goes
// as one batch through each stage, not token by token). The model is synth-base (8 layers,
// d_model 512: 1 MiB of hidden states for the prompt at each crossing), split 3 + 3 + 2 as
// BenchmarkShardedPrefill splits it in one process. Each stage is a Server on a libp2p host
// of its own on loopback, with a synthetic backend of its own that loads only its layers;
// the head is a synthetic backend on another host that computes the embeddings, the
// logits and the sampling and runs the layers through a Pipeline; the single node is that
// backend with the whole model, as a node that holds it runs it. One op is one request
// of each, max_tokens 1 (the prompt in one call to the layers, the logits, one sampled
// token), in alternating order; the pipeline is opened and closed outside the timing, as
// a head opens it once per request before the prompt. Metrics, medians over the ops:
//
//	split/single     the pipeline's time ÷ the single node's (the S3 figure)
//	single-ms        the single node's time
//	split-ms         the pipeline's
//
// and the CPU time of each path per op (the whole process's: the head, the stages and
// libp2p, on 2 cores) with their ratio (split/single-cpu, a median too): on a machine
// shared with other work the times' ratio moves with the load, the CPU's much less; and
// the single node's prompt tokens/s.
func BenchmarkS3PrefillThreeStages(b *testing.B) {
	const model = "synth-base"
	ctx := b.Context()
	preset, _ := synth.LookupPreset(model)
	bounds := []int{0, preset.Layers * 3 / 8, preset.Layers * 6 / 8, preset.Layers}
	single, err := synth.New(model) // also the head: it loads only the embeddings and logits for it
	if err != nil {
		b.Fatal(err)
	}
	head := newHost(b)
	var hops []Hop
	for i := range 3 {
		be, err := synth.New(model)
		if err != nil {
			b.Fatal(err)
		}
		h := newHost(b)
		srv := NewServer(h, be)
		b.Cleanup(func() { srv.Close() })
		know(head, h)
		hops = append(hops, Hop{Peer: h.ID(), Lo: bounds[i], Hi: bounds[i+1]})
	}
	// '\x01' is one token; with the two role markers the prompt is 512 tokens.
	req := &inference.Request{
		Model:     model,
		Messages:  []inference.Message{{Role: inference.RoleUser, Content: strings.Repeat("\x01", 510)}},
		MaxTokens: new(1),
	}
	maxPositions := req.PromptTokensBound() + req.EffectiveMaxTokens() // as a head plans it
	discard := func(inference.Token) error { return nil }
	var splitTook, singleTook, splitCPU, singleCPU []time.Duration
	split := func() {
		p, err := Open(ctx, head, model, hops, maxPositions)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		c0, t0 := cpuTime(), time.Now()
		res, err := single.GenerateWith(ctx, req, p.Forward, discard)
		took, cpu := time.Since(t0), cpuTime()-c0
		if err != nil || res.Usage.PromptTokens != 512 {
			b.Fatalf("GenerateWith: %+v, %v", res, err)
		}
		if st := p.Stats(); st.Steps != 1 || st.Positions != 512 {
			b.Fatalf("the prompt went as %d steps of %d positions in all, want one of 512", st.Steps, st.Positions)
		}
		splitTook, splitCPU = append(splitTook, took), append(splitCPU, cpu)
	}
	whole := func() {
		c0, t0 := cpuTime(), time.Now()
		res, err := single.Generate(ctx, req, discard)
		took, cpu := time.Since(t0), cpuTime()-c0
		if err != nil || res.Usage.PromptTokens != 512 {
			b.Fatalf("Generate: %+v, %v", res, err)
		}
		singleTook, singleCPU = append(singleTook, took), append(singleCPU, cpu)
	}
	split() // warm up: the stages' layers and the head's embeddings loaded, buffers grown
	if err := single.Load(ctx, model); err != nil {
		b.Fatal(err)
	}
	whole()
	splitTook, singleTook, splitCPU, singleCPU = nil, nil, nil, nil
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			whole()
			split()
		} else {
			split()
			whole()
		}
	}
	b.StopTimer()
	b.ReportMetric(medianRatio(splitTook, singleTook), "split/single")
	b.ReportMetric(medianRatio(splitCPU, singleCPU), "split/single-cpu")
	b.ReportMetric(median(singleTook)/1e3, "single-ms")
	b.ReportMetric(median(splitTook)/1e3, "split-ms")
	b.ReportMetric(median(singleCPU)/1e3, "single-cpu-ms")
	b.ReportMetric(median(splitCPU)/1e3, "split-cpu-ms")
	b.ReportMetric(512/(median(singleTook)/1e6), "prompt-tokens/s")
}

// cpuTime is the process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// delayProxy forwards the TCP connections made to it to a target, delaying every byte by
// the same one-way delay in each direction, without a bandwidth limit: what is sent back
// to back arrives back to back, delay later. The delay can change between steps.
type delayProxy struct {
	ln     net.Listener
	addr   ma.Multiaddr
	target ma.Multiaddr
	delay  atomic.Int64 // nanoseconds
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  []net.Conn
}

// newDelayProxy starts a proxy on loopback to the TCP address among addrs; the benchmark's
// cleanup closes it.
func newDelayProxy(b *testing.B, addrs []ma.Multiaddr) *delayProxy {
	b.Helper()
	var target ma.Multiaddr
	for _, a := range addrs {
		if _, err := a.ValueForProtocol(ma.P_TCP); err == nil {
			target = a
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr, err := manet.FromNetAddr(ln.Addr())
	if err != nil {
		b.Fatal(err)
	}
	p := &delayProxy{ln: ln, addr: addr, target: target}
	p.wg.Add(1)
	go p.accept() // returns when Close closes the listener
	b.Cleanup(p.Close)
	return p
}

func (p *delayProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		d, err := manet.Dial(p.target)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, d) {
			return
		}
		p.wg.Add(2)
		go p.pipe(d, c) // each returns when its source fails: the peer's close or Close
		go p.pipe(c, d)
	}
}

// track keeps conns for Close, unless the proxy is closed (they are closed then).
func (p *delayProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	p.conns = append(p.conns, conns...)
	return true
}

// pipe copies src to dst, each chunk written the delay after it was read.
func (p *delayProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 1024)
	written := make(chan struct{})
	go func() { // the writer: returns when q is closed, below
		defer close(written)
		timer := time.NewTimer(0)
		defer timer.Stop()
		failed := false
		for c := range q {
			if wait := time.Until(c.at); wait > 0 && !failed {
				timer.Reset(wait)
				<-timer.C
			}
			if !failed {
				_, err := dst.Write(c.b)
				failed = err != nil
			}
		}
		dst.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{b: slices.Clone(buf[:n]), at: time.Now().Add(time.Duration(p.delay.Load()))}
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-written
}

// Close closes the listener and every connection, and waits for the proxy's goroutines.
func (p *delayProxy) Close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}

// echoLink is a TCP connection through a delayProxy to an echo server: the reference of
// S2, the one-way delay the proxy really imposes.
type echoLink struct {
	px   *delayProxy
	conn net.Conn
	msg  []byte
	back []byte
}

// newEchoLink starts an echo server and a proxy in front of it and connects to the proxy;
// the benchmark's cleanup closes them (the connection first, which ends the echo).
func newEchoLink(b *testing.B, size int) *echoLink {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	echoed := make(chan struct{})
	go func() { // the echo server: one connection, until it closes
		defer close(echoed)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	target, err := manet.FromNetAddr(ln.Addr())
	if err != nil {
		b.Fatal(err)
	}
	e := &echoLink{px: newDelayProxy(b, []ma.Multiaddr{target}), msg: make([]byte, size), back: make([]byte, size)}
	if e.conn, err = manet.Dial(e.px.addr); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		e.conn.Close()
		ln.Close()
		<-echoed
	})
	return e
}

// roundTrip sends the message through the proxy at delay d and reads its echo back.
func (e *echoLink) roundTrip(b *testing.B, d time.Duration) time.Duration {
	e.px.delay.Store(int64(d))
	began := time.Now()
	if _, err := e.conn.Write(e.msg); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(e.conn, e.back); err != nil {
		b.Fatal(err)
	}
	return time.Since(began)
}
