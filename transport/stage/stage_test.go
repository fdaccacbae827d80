package stage

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"go.uber.org/goleak"

	"github.com/meshinfer/meshinfer/inference"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// eventWait bounds a test's wait for an event that must come: far above what it takes, so
// that only a hang trips it.
const eventWait = 20 * time.Second

func newHost(t testing.TB) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// stageNode is a stage: a host, its backend and its server, with the sessions it ended.
type stageNode struct {
	h    host.Host
	be   *arith
	srv  *Server
	ends chan SessionEnd
}

func newStage(t testing.TB, be *arith, opts ...ServerOption) *stageNode {
	t.Helper()
	n := &stageNode{h: newHost(t), be: be, ends: make(chan SessionEnd, 64)}
	opts = append(opts, WithOnSessionEnd(func(e SessionEnd) { n.ends <- e }))
	n.srv = NewServer(n.h, be, opts...)
	t.Cleanup(func() { n.srv.Close() }) // before the host closes: cleanups run last first
	return n
}

// ended waits for the stage's next session end.
func (n *stageNode) ended(t testing.TB) SessionEnd {
	t.Helper()
	select {
	case e := <-n.ends:
		return e
	case <-time.After(eventWait):
		t.Fatalf("stage %s: no session ended within %v", n.h.ID(), eventWait)
		return SessionEnd{}
	}
}

// freed waits for the stage's next session end and checks that it ended with one of
// outcomes and left nothing held: no session at the server, none at the backend (its KV
// cache freed).
func (n *stageNode) freed(t testing.TB, outcomes ...string) SessionEnd {
	t.Helper()
	e := n.ended(t)
	if !slices.Contains(outcomes, e.Outcome) {
		t.Errorf("stage %d ended with %q, want one of %q", e.Index, e.Outcome, outcomes)
	}
	if s, b := n.srv.Sessions(), n.be.sessions(); s != 0 || b != 0 {
		t.Errorf("stage %d: %d sessions at the server, %d at the backend after the end", e.Index, s, b)
	}
	return e
}

// chain is a head and stages on loopback hosts. The head knows the stages' addresses;
// the stages know none of each other's: each learns its next hop's from the open frame.
type chain struct {
	head   host.Host
	stages []*stageNode
	hops   []Hop
}

// newChain starts a stage per range, each with its own backend of the same model.
func newChain(t testing.TB, layers, width int, ranges [][2]int, opts ...ServerOption) chain {
	t.Helper()
	c := chain{head: newHost(t)}
	for _, r := range ranges {
		n := newStage(t, newArith(layers, width, 8), opts...)
		know(c.head, n.h)
		c.stages = append(c.stages, n)
		c.hops = append(c.hops, Hop{Peer: n.h.ID(), Lo: r[0], Hi: r[1]})
	}
	return c
}

func (c chain) open(t testing.TB, maxPositions int, opts ...PipelineOption) *Pipeline {
	t.Helper()
	p, err := Open(t.Context(), c.head, arithModel, c.hops, maxPositions, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// promptStates is n positions of deterministic hidden states.
func promptStates(n, width int) []float32 {
	r := rand.New(rand.NewPCG(1, 2))
	h := make([]float32, n*width)
	for i := range h {
		h[i] = r.Float32()*2 - 1
	}
	return h
}

// generate runs a generation's layer calls through f, as a head would: the prompt as one
// prefill call, then decode steps of one position, each fed with (a function of) the last
// output, as a sampled token's embedding would be. It returns every call's output.
func generate(ctx context.Context, f inference.Layers, width int, prompt []float32, decode int) ([][]float32, error) {
	out, err := f(ctx, prompt, len(prompt)/width)
	if err != nil {
		return nil, err
	}
	outs := [][]float32{out}
	for k := range decode {
		last := out[len(out)-width:]
		next := make([]float32, width)
		for i := range next {
			next[i] = 0.5*last[i] + float32(k%5)/8
		}
		if out, err = f(ctx, next, 1); err != nil {
			return nil, err
		}
		outs = append(outs, out)
	}
	return outs, nil
}

// local runs the same generation on all layers in one process: the reference.
func local(t testing.TB, layers, width int, prompt []float32, decode int) [][]float32 {
	t.Helper()
	be := newArith(layers, width, 1)
	ss, err := be.OpenStage(t.Context(), arithModel, 0, layers, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	outs, err := generate(t.Context(), ss.Forward, width, prompt, decode)
	if err != nil {
		t.Fatal(err)
	}
	return outs
}

func sameBits(a, b [][]float32) bool {
	return slices.EqualFunc(a, b, func(x, y []float32) bool {
		return slices.EqualFunc(x, y, func(u, v float32) bool { return math.Float32bits(u) == math.Float32bits(v) })
	})
}

// The arithmetic can tell a lost or reordered position: the chains' equality below could
// not pass with a transport that dropped, repeated or swapped one.
func TestArithDependsOnEveryPositionInOrder(t *testing.T) {
	const layers, width, n = 6, 16, 9
	prompt := promptStates(n, width)
	ref := local(t, layers, width, prompt, 4)
	swapped := slices.Clone(prompt)
	for i := range width {
		swapped[2*width+i], swapped[3*width+i] = swapped[3*width+i], swapped[2*width+i]
	}
	if sameBits(ref[1:], local(t, layers, width, swapped, 4)[1:]) {
		t.Fatal("two positions swapped in the prompt, yet the decode steps' outputs are the same")
	}
	lost := slices.Concat(prompt[:4*width], prompt[5*width:])
	if sameBits(ref[1:], local(t, layers, width, lost, 4)[1:]) {
		t.Fatal("a position lost from the prompt, yet the decode steps' outputs are the same")
	}
}

// A chain of stages gives exactly (bit for bit) what the same layers give in one process,
// prefill and decode, whether the prompt goes as one step or several; Close then frees
// every stage's session.
func TestChainMatchesOneProcess(t *testing.T) {
	const layers, width, promptLen, decode = 6, 16, 11, 8
	prompt := promptStates(promptLen, width)
	want := local(t, layers, width, prompt, decode)
	tests := []struct {
		name   string
		ranges [][2]int
		opts   []PipelineOption
	}{
		{"one stage", [][2]int{{0, 6}}, nil},
		{"two stages", [][2]int{{0, 2}, {2, 6}}, nil},
		{"three stages", [][2]int{{0, 1}, {1, 4}, {4, 6}}, nil},
		{"three stages, prompt in steps of 3", [][2]int{{0, 3}, {3, 5}, {5, 6}}, []PipelineOption{WithMaxBatch(3)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newChain(t, layers, width, tt.ranges)
			p := c.open(t, 64, tt.opts...)
			if p.Width() != width {
				t.Fatalf("width %d, want %d", p.Width(), width)
			}
			got, err := generate(t.Context(), p.Forward, width, prompt, decode)
			if err != nil {
				t.Fatal(err)
			}
			if !sameBits(got, want) {
				t.Fatalf("the chain's outputs differ from one process's:\n%v\n%v", got[len(got)-1][:4], want[len(want)-1][:4])
			}
			for i, n := range c.stages {
				if s := n.be.sessions(); s != 1 {
					t.Fatalf("stage %d holds %d backend sessions while the pipeline is open, want 1", i, s)
				}
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			for i, n := range c.stages {
				e := n.freed(t, OutcomeClosed)
				steps := 1 + decode
				if len(tt.opts) > 0 {
					steps = (promptLen+2)/3 + decode
				}
				if e.Index != i || e.Positions != promptLen+decode || e.Steps != steps || e.Head != c.head.ID() {
					t.Fatalf("stage %d's end %+v: want index %d, %d positions in %d steps, head %s", i, e, i, promptLen+decode, steps, c.head.ID())
				}
			}
			if _, err := p.Forward(t.Context(), prompt[:width], 1); inference.CodeOf(err) != inference.CodeUnavailable {
				t.Fatalf("Forward after Close: %v, want unavailable", err)
			}
		})
	}
}

// failedStage checks that err is code about stage index of c.
func (c chain) failedStage(t testing.TB, err error, code inference.Code, index int) {
	t.Helper()
	if inference.CodeOf(err) != code {
		t.Fatalf("error %v, want %s", err, code)
	}
	var fs *FailedStage
	if !errors.As(err, &fs) {
		t.Fatalf("error %v names no stage", err)
	}
	if fs.Index != index || fs.Peer != c.hops[index].Peer {
		t.Fatalf("error %v names stage %d (%s), want %d (%s)", err, fs.Index, fs.Peer, index, c.hops[index].Peer)
	}
}

// A chain that cannot be set up fails Open with the refusing stage's typed error, named,
// and the stages before it free the sessions they had opened.
func TestOpenRefusals(t *testing.T) {
	const layers, width = 6, 16
	kvOfStage1 := int64(layers*width*4) * 4 / layers * 64 // layers [2, 6) for 64 positions
	tests := []struct {
		name      string
		opts      [2][]ServerOption // per stage
		capacity  [2]int            // per stage's backend
		model     string
		positions int
		code      inference.Code
		stage     int
	}{
		{"backend cannot hold it", [2][]ServerOption{}, [2]int{8, 0}, arithModel, 64, inference.CodeOverloaded, 1},
		{"over the KV budget", [2][]ServerOption{nil, {WithKVBudget(kvOfStage1 - 1)}}, [2]int{8, 8}, arithModel, 64, inference.CodeOverloaded, 1},
		{"no session allowed", [2][]ServerOption{{WithMaxSessions(0, 0)}}, [2]int{8, 8}, arithModel, 64, inference.CodeOverloaded, 0},
		{"unknown model", [2][]ServerOption{}, [2]int{8, 8}, "nope", 64, inference.CodeModelNotFound, 0},
		{"past the context", [2][]ServerOption{}, [2]int{8, 8}, arithModel, 5000, inference.CodeContextOverflow, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := chain{head: newHost(t)}
			for i, r := range [][2]int{{0, 2}, {2, 6}} {
				n := newStage(t, newArith(layers, width, tt.capacity[i]), tt.opts[i]...)
				know(c.head, n.h)
				c.stages = append(c.stages, n)
				c.hops = append(c.hops, Hop{Peer: n.h.ID(), Lo: r[0], Hi: r[1]})
			}
			p, err := Open(t.Context(), c.head, tt.model, c.hops, tt.positions)
			if err == nil {
				p.Close()
				t.Fatal("Open succeeded")
			}
			c.failedStage(t, err, tt.code, tt.stage)
			if tt.stage == 1 {
				e := c.stages[0].freed(t, string(tt.code))
				if e.Failed != 1 {
					t.Fatalf("stage 0's session ended blaming stage %d, want 1", e.Failed)
				}
			}
			if got := c.stages[tt.stage].srv.Stats().Refused; (tt.code == inference.CodeOverloaded) != (got == 1) {
				t.Fatalf("the refusing stage counted %d refusals", got)
			}
			for i, n := range c.stages {
				if s, b := n.srv.Sessions(), n.be.sessions(); s != 0 || b != 0 {
					t.Fatalf("stage %d holds %d sessions (%d at the backend) after a refused open", i, s, b)
				}
			}
		})
	}
}

// A stage at its limit of sessions per previous hop refuses the next one at once with
// overloaded, and admits it again once a session is freed.
func TestSessionsPerPeerAreBounded(t *testing.T) {
	c := newChain(t, 4, 8, [][2]int{{0, 2}, {2, 4}}, WithMaxSessions(8, 2))
	p1, p2 := c.open(t, 16), c.open(t, 16)
	_, err := Open(t.Context(), c.head, arithModel, c.hops, 16)
	c.failedStage(t, err, inference.CodeOverloaded, 0)
	p1.Close()
	for _, n := range c.stages {
		n.ended(t)
	}
	p3 := c.open(t, 16)
	p2.Close()
	p3.Close()
	for _, n := range c.stages {
		n.ended(t)
		n.freed(t, OutcomeClosed)
	}
}

// block makes a stage's backend hold every step until its context ends, telling entered
// when a step reached it.
func block(be *arith) (entered chan struct{}) {
	entered = make(chan struct{}, 16)
	g := func(ctx context.Context) error {
		entered <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}
	be.gate.Store(&g)
	return entered
}

// A stage whose host dies in the middle of a step fails the head's Forward at once with
// peer_lost naming it, long before the step timeout; every other stage frees its session.
func TestStageKilledMidStep(t *testing.T) {
	const width = 8
	c := newChain(t, 6, width, [][2]int{{0, 2}, {2, 4}, {4, 6}})
	p := c.open(t, 64)
	defer p.Close()
	if _, err := p.Forward(t.Context(), promptStates(5, width), 5); err != nil {
		t.Fatal(err)
	}
	entered := block(c.stages[1].be)
	errc := make(chan error, 1)
	go func() {
		_, err := p.Forward(t.Context(), promptStates(1, width), 1)
		errc <- err
	}()
	<-entered
	c.stages[1].h.Close()
	var err error
	select {
	case err = <-errc:
	case <-time.After(eventWait):
		t.Fatal("Forward still runs after its stage died")
	}
	c.failedStage(t, err, inference.CodePeerLost, 1)
	// The others blame stage 1, or the head when its reset (once it knew) reached them
	// before their own stream to stage 1 broke.
	for _, i := range []int{0, 2} {
		if e := c.stages[i].freed(t, string(inference.CodePeerLost)); e.Failed != 1 && e.Failed != headStage {
			t.Fatalf("stage %d's session ended blaming stage %d, want 1 or the head", i, e.Failed)
		}
	}
	c.stages[1].ended(t)
	if b := c.stages[1].be.sessions(); b != 0 {
		t.Fatalf("the dead stage's backend still holds %d sessions", b)
	}
	if _, again := p.Forward(t.Context(), promptStates(1, width), 1); !errors.Is(again, err) {
		t.Fatalf("Forward on a broken pipeline: %v, want the same %v", again, err)
	}
}

// A stage that stops answering (alive, its streams open, its layers never returning: a
// frozen process) fails the head's step with timeout at that step's timeout, the prefill
// one for a step of several positions, the decode one for a step of one, and the whole
// chain is freed.
func TestSilentStageTimesOut(t *testing.T) {
	const width, short, long = 8, 300 * time.Millisecond, time.Minute
	for _, tc := range []struct {
		name      string
		positions int
		opt       PipelineOption
	}{
		{"prefill step", 3, WithStepTimeouts(short, long)},
		{"decode step", 1, WithStepTimeouts(long, short)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChain(t, 4, width, [][2]int{{0, 2}, {2, 4}})
			p := c.open(t, 64, tc.opt)
			defer p.Close()
			if _, err := p.Forward(t.Context(), promptStates(3, width), 3); err != nil {
				t.Fatal(err)
			}
			block(c.stages[1].be)
			start := time.Now()
			_, err := p.Forward(t.Context(), promptStates(tc.positions, width), tc.positions)
			if took := time.Since(start); inference.CodeOf(err) != inference.CodeTimeout || took >= long {
				t.Fatalf("Forward through a silent stage: %v after %v, want timeout at %v", err, took, short)
			}
			for _, n := range c.stages {
				e := n.ended(t)
				if s, b := n.srv.Sessions(), n.be.sessions(); s != 0 || b != 0 {
					t.Fatalf("stage %d holds %d sessions (%d at the backend) after the timeout (%+v)", e.Index, s, b, e)
				}
			}
		})
	}
}

// A head that goes away (its host closed, no end frame) leaves no session behind: stage 0
// finds out and tells the chain, and every stage frees its session at once.
func TestHeadLostFreesTheChain(t *testing.T) {
	const width = 8
	c := newChain(t, 6, width, [][2]int{{0, 2}, {2, 4}, {4, 6}})
	p := c.open(t, 64)
	defer p.Close()
	if _, err := p.Forward(t.Context(), promptStates(3, width), 3); err != nil {
		t.Fatal(err)
	}
	c.head.Close()
	for _, n := range c.stages {
		if e := n.freed(t, string(inference.CodePeerLost)); e.Failed != headStage {
			t.Fatalf("stage %d's session ended blaming %d, want the head", e.Index, e.Failed)
		}
	}
}

// A session left idle is freed by every stage after the session idle time, and the head
// learns it as a typed error on its next step.
func TestIdleSessionIsFreed(t *testing.T) {
	const width = 8
	c := newChain(t, 4, width, [][2]int{{0, 2}, {2, 4}}, WithSessionIdle(200*time.Millisecond))
	p := c.open(t, 64)
	defer p.Close()
	if _, err := p.Forward(t.Context(), promptStates(2, width), 2); err != nil {
		t.Fatal(err)
	}
	// Stage 0 idles out first (its last step came first) and tells both ways; stage 1 idles
	// out itself, hears it from stage 0, or sees the head's reset once the head heard it.
	c.stages[0].freed(t, string(inference.CodeTimeout))
	c.stages[1].freed(t, string(inference.CodeTimeout), string(inference.CodePeerLost))
	if _, err := p.Forward(t.Context(), promptStates(1, width), 1); inference.CodeOf(err) != inference.CodeTimeout {
		t.Fatalf("Forward after the stages freed the idle session: %v, want timeout", err)
	}
}

// A stage's own failure (its layers' error) reaches the head named, with its code, and the
// chain is freed; a step past the pipeline's positions is refused at the head without
// breaking it.
func TestStageErrorsReachTheHead(t *testing.T) {
	const width = 8
	c := newChain(t, 4, width, [][2]int{{0, 2}, {2, 4}})
	p := c.open(t, 4)
	defer p.Close()
	if _, err := p.Forward(t.Context(), promptStates(5, width), 5); inference.CodeOf(err) != inference.CodeContextOverflow {
		t.Fatalf("5 positions in a 4-position pipeline: %v, want context_overflow", err)
	}
	if _, err := p.Forward(t.Context(), promptStates(4, width), 4); err != nil {
		t.Fatalf("the pipeline broke after a refused step: %v", err)
	}
	p.Close()
	for _, n := range c.stages {
		n.freed(t, OutcomeClosed)
	}
	g := func(context.Context) error {
		return inference.Errorf(inference.CodeUnavailable, "GPU fell off the bus")
	}
	c.stages[0].be.gate.Store(&g)
	p2 := c.open(t, 8)
	defer p2.Close()
	_, err := p2.Forward(t.Context(), promptStates(1, width), 1)
	c.failedStage(t, err, inference.CodeUnavailable, 0)
	if e := c.stages[0].freed(t, string(inference.CodeUnavailable)); e.Failed != 0 {
		t.Fatalf("stage 0's session ended blaming %d, want itself", e.Failed)
	}
	// Stage 1 hears it from stage 0, or sees the head's reset once the head heard it.
	if e := c.stages[1].freed(t, string(inference.CodeUnavailable), string(inference.CodePeerLost)); e.Failed != 0 && e.Failed != headStage {
		t.Fatalf("stage 1's session ended blaming %d, want stage 0 or the head", e.Failed)
	}
}

// Close of a stage's server ends its sessions with shutting_down, which reaches the head.
func TestServerCloseEndsSessions(t *testing.T) {
	const width = 8
	c := newChain(t, 4, width, [][2]int{{0, 2}, {2, 4}})
	p := c.open(t, 8)
	defer p.Close()
	c.stages[1].srv.Close()
	c.stages[1].freed(t, string(inference.CodeShuttingDown))
	c.stages[0].freed(t, string(inference.CodeShuttingDown))
	_, err := p.Forward(t.Context(), promptStates(1, width), 1)
	c.failedStage(t, err, inference.CodeShuttingDown, 1)
}

// know makes h know p's addresses.
func know(h host.Host, p host.Host) {
	h.Peerstore().AddAddrs(p.ID(), p.Addrs(), peerstore.PermanentAddrTTL)
}

// A session's end reports its duration from admission to end on the server's clock: here
// one that moves a minute each time it is read, read once at each end.
func TestSessionEndDurationOnTheServersClock(t *testing.T) {
	var reads atomic.Int64
	clock := func() time.Time {
		return time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC).Add(time.Duration(reads.Add(1)) * time.Minute)
	}
	const layers, width = 4, 8
	c := chain{head: newHost(t)}
	n := newStage(t, newArith(layers, width, 8), WithClock(clock))
	know(c.head, n.h)
	c.stages, c.hops = []*stageNode{n}, []Hop{{Peer: n.h.ID(), Lo: 0, Hi: layers}}
	p := c.open(t, 16)
	if _, err := generate(t.Context(), p.Forward, width, promptStates(3, width), 2); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if e := n.freed(t, OutcomeClosed); e.Duration != time.Minute || e.Lo != 0 || e.Hi != layers || e.Steps != 3 {
		t.Fatalf("session end %+v: want a minute's duration, layers [0, %d), 3 steps", e, layers)
	}
}
