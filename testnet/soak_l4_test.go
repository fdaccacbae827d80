//go:build soak

package testnet

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/reputation"
)

// soakPlan sizes one run of docs/reliability.md L4: For of load, the first Warmup of it
// left out of the heap fit and ending with the baseline of goroutines and FDs, and a
// sample of the process every Sample.
type soakPlan struct {
	For, Warmup, Sample time.Duration
}

// TestSoakL4 is docs/reliability.md L4 as the catalogue states it (T3, `-tags soak`, about
// 11 min): 20 req/s for 10 min with 5 % injected peer faults, the heap fitted after a 2 min
// warm-up, sampled every 5 s (96 samples in the fit). With SOAK_HEAP_PROFILES=<dir> either
// test writes a heap profile at the warm-up's end and at the end (soakProfEnv).
func TestSoakL4(t *testing.T) {
	runSoak(t, soakPlan{For: 10 * time.Minute, Warmup: 2 * time.Minute, Sample: 5 * time.Second})
}

// TestSoakL4Short is L4's T1 version (`make reliability`, `-tags soak`, about 4.5 min): the
// same load and faults, 2 min fitted (a sample every 2 s: 60 in the fit) after the
// catalogue's 2 min warm-up. The catalogue's T1 is 2 min in all; a warm-up scaled down to
// 30 s fitted the filling of caches that GossipSub keeps for 2 min (seen messages,
// delivery records): slopes of 0.5-1.2 MiB/min against 0.2-0.5 after 2 min. A leak of
// 0.5 MiB/min has 2 min to show: this version catches one per request or per fault (20 or
// 1 a second); the 10-minute one a slower drift.
func TestSoakL4Short(t *testing.T) {
	runSoak(t, soakPlan{For: 4 * time.Minute, Warmup: 2 * time.Minute, Sample: 2 * time.Second})
}

// The load and the faults, the catalogue's.
const (
	soakEvery = 50 * time.Millisecond // one request every 50 ms: 20 req/s
	// soakFaultP is the chance that a request brings a peer fault along: 5 %, one fault a
	// second at 20 req/s.
	soakFaultP = 0.05
	// soakPeers is how many serving peers run: a fault takes one out at a time (a kill is
	// replaced at once, a stall heals after soakStall), and at one fault a second two or
	// three are out at once (a stall for 4 s, a killed peer until the router holds it
	// stale, its replacement until the router has its vector).
	soakPeers = 6
	// soakLeftFresh bounds the killed peers the router still holds fresh (3 s after their
	// last vector at the 1 s heartbeat), TestChurn's bound: a kill while three are makes a
	// stall instead. Before the router decided a failed request's next peers again and
	// tried silent peers last, 4.6-6.4 % of requests failed at this bound (with 5 peers),
	// spending their 3 mesh attempts on stalled and killed peers, and the test held kills
	// to one fresh at a time (docs/reliability.md L4).
	soakLeftFresh = 3
	// soakStall is how long a stalled peer stays frozen: twice the router's silence bound
	// (soakSilence), so the router gives up on it and resumes elsewhere, instead of
	// only waiting longer.
	soakStall = 4 * time.Second
	// soakSilence is the router's first-token and inter-token timeouts (production: 30 s
	// and 5 s), shortened as TestStreamResumesAfterPeerFrozen does, so that a stall costs
	// a request seconds, not its timeout (churnTimeout).
	soakSilence = 2 * time.Second
	// soakInFlight bounds the requests open at once (a healthy one lasts a few hundred
	// milliseconds under -race: about 10 are open at 20 req/s). A tick that finds the bound
	// reached sends nothing and is counted: the load then was below 20 req/s.
	soakInFlight = 64
	// soakSeeds is how many different requests rotate (each compared with its reference).
	soakSeeds = 4
)

// The stability goals, the catalogue's.
const (
	soakHeapSlope = 0.5 // MiB/min, least squares over the samples after the warm-up
	soakGoroutine = 2   // %, end against the warm-up's baseline
	// soakGoroutineSlack is the least drift in goroutines allowed, whatever 2 % is: a
	// libp2p connection between two nodes is 6-7 goroutines (yamux, identify, GossipSub's
	// per-peer loops; measured here), so a mesh of a few hundred goroutines would fail 2 %
	// on two connections more at the end. With the seven nodes here (about 800) 2 % is the
	// larger.
	soakGoroutineSlack = 12
	soakFDs            = 10 // open files, end against the baseline
)

// Quiet measurements (the baseline after the warm-up and the end): the least of
// quietReadings readings quietEvery apart, with no request open, no peer stalled and the
// mesh converged; the least, since goroutines and connections that are closing (a
// keep-alive, a dial to a killed peer backing off) only add.
const (
	quietReadings = 20
	quietEvery    = 100 * time.Millisecond
)

// runSoak runs L4: a router (node 0, serving nothing) is sent a streaming request every
// soakEvery on the OpenAI API; each brings a peer fault along with probability soakFaultP,
// in turn a kill (Testnet.Kill, a crash, and a new peer started in its place) and a stall
// (the peer's backend frozen for soakStall, its host answering on). It asserts:
//
//   - every request ends exactly once (churnRequest: complete and identical to the
//     model's own text, or a typed error), none stuck, and at least 99 % complete: at
//     least one peer the router can route to stays healthy through every fault;
//   - the heap's least-squares slope over the samples after the warm-up (each after a
//     runtime.GC) is at most 0.5 MiB/min;
//   - goroutines at the end within ±2 % of the baseline after the warm-up (at least
//     soakGoroutineSlack), and open FDs within ±10 (Linux; skipped with a reason
//     elsewhere), both measured quiet (see quietReadings);
//   - the router's reputation store within its cap (the production one, 4096) at every
//     sample.
//
// Pacing is wall-clock; no assertion is on a time: the figures are the process's own
// counts, compared within the run.
func runSoak(t *testing.T, plan soakPlan) {
	if os.Getenv(soakProfEnv) != "" {
		runtime.MemProfileRate = 4096 // the default, 512 KiB, misses most of a slope's growth
	}
	stalls := &stallSet{m: map[int]*stall{}}
	tn := start(t, Options{Nodes: 1 + soakPeers, NoConsole: true, Heartbeat: fastHeartbeat, ModelsFor: serveNothing,
		Configure: func(i int, cfg *node.Config) {
			if i != 0 {
				cfg.APIAddr = node.APIOff // only the router is asked
				s := stalls.add(i)
				cfg.WrapBackend = func(b inference.Backend) inference.Backend { return stalled{b, s} }
				return
			}
			cfg.PeerFirstTokenTimeout, cfg.PeerInterTokenTimeout = soakSilence, soakSilence
			cfg.PeerOpenTimeout = churnOpen
		}})
	within(t, 15*time.Second, "converge", tn.Converged)
	router := tn.Node(0)

	s := &soaker{t: t, tn: tn, router: router, stalls: stalls, thawAt: map[int]time.Time{}, left: map[peer.ID]time.Time{},
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 4))}
	for i := 1; i <= soakPeers; i++ {
		s.running = append(s.running, i)
	}
	l := &soakLoad{t: t, api: router.APIAddr(), faults: make(chan struct{}, 8), stop: make(chan struct{}), tally: churnTally{codes: map[string]int{}},
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: soakInFlight}},
		rng:    rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 40))}
	for k := range soakSeeds {
		l.bodies[k] = routedBody("synth-tiny", churnTokens, int64(k), nil)
		l.refs[k] = reference(t, l.bodies[k])
	}
	defer l.client.CloseIdleConnections()
	// Also on a failure below: no request outlives the test.
	defer l.halt()
	l.wg.Go(l.launch)

	sampleTick := time.NewTicker(plan.Sample)
	defer sampleTick.Stop()
	healTick := time.NewTicker(100 * time.Millisecond)
	defer healTick.Stop()
	began := time.Now()
	warm := time.NewTimer(plan.Warmup)
	end := time.NewTimer(plan.For)
	var base, last quiet
	var fitFrom time.Time // zero until the warm-up's end: samples before it are not fitted
loop:
	for {
		select {
		case <-l.faults:
			s.fault()
		case now := <-healTick.C:
			s.heal(now)
		case now := <-sampleTick.C:
			s.sample(now, !fitFrom.IsZero())
		case <-warm.C:
			l.paused.Store(true)
			base = s.quiet(l)
			l.paused.Store(false)
			fitFrom = time.Now()
		case <-end.C:
			break loop
		}
	}
	l.halt()
	last = s.quiet(l)
	loadFor := time.Since(began)

	tl := l.tally
	tl.check(t)
	if tl.total == 0 {
		t.Fatalf("no request sent in %v", plan.For)
	}
	if s.kills == 0 || s.stallsMade == 0 {
		t.Fatalf("soak without both kinds of fault: %d kills, %d stalls", s.kills, s.stallsMade)
	}

	var xs, ys []float64
	for _, p := range s.samples {
		if p.fitted {
			xs = append(xs, p.at.Sub(fitFrom).Minutes())
			ys = append(ys, float64(p.heap)/(1<<20))
		}
	}
	heapSlope, fitted := slope(xs, ys)
	if !fitted {
		t.Fatalf("%d heap samples after the warm-up: nothing to fit", len(xs))
	}
	if heapSlope > soakHeapSlope {
		t.Errorf("heap grows %.3f MiB/min over %d samples after the warm-up, want ≤ %v", heapSlope, len(xs), soakHeapSlope)
	}
	goroutineBound := max(base.goroutines*soakGoroutine/100, soakGoroutineSlack)
	if d := last.goroutines - base.goroutines; d > goroutineBound || d < -goroutineBound {
		t.Errorf("goroutines %d at the end, %d after the warm-up: %+d, want within ±%d (±%d %%)", last.goroutines, base.goroutines, d, goroutineBound, soakGoroutine)
	}
	fds := "FDs not counted: " + fdsSkipped
	if base.fds >= 0 && last.fds >= 0 {
		if d := last.fds - base.fds; d > soakFDs || d < -soakFDs {
			t.Errorf("open FDs %d at the end, %d after the warm-up: %+d, want within ±%d", last.fds, base.fds, d, soakFDs)
		}
		fds = fmt.Sprintf("open FDs %d → %d (%+d, bound ±%d)", base.fds, last.fds, last.fds-base.fds, soakFDs)
	} else {
		t.Logf("FD check skipped: %s", fdsSkipped)
	}
	capEntries := reputation.DefaultMaxEntries
	if s.peakScores > capEntries || s.peakTargets > capEntries {
		t.Errorf("reputation store past its cap: %d scores, %d health records, cap %d", s.peakScores, s.peakTargets, capEntries)
	}
	t.Logf("figure L4: a request every %v for %v (%d sent, %.1f req/s; %d ticks at the %d in-flight bound), %d faults (%d kills each replaced, %d stalls of %v; %d faults skipped, %d dropped while others waited, %d kills held as a stall while %d killed peers were still fresh): "+
		"%d of %d requests succeeded (%.2f %%), typed errors %v, 0 ended twice or without an end, %d stuck beyond %v (slowest %v); "+
		"heap slope %+.3f MiB/min over %d samples after a %v warm-up (%.1f → %.1f MiB quiet, peak %.1f MiB); goroutines %d → %d (%+.2f %%, bound ±%d; connections of all nodes %d → %d); %s; "+
		"reputation peak %d scores and %d health records, cap %d; the router's peerstore holds %d peers (%d nodes ever started, %d killed)",
		soakEvery, plan.For, tl.total, float64(tl.total)/loadFor.Seconds(), l.capped.Load(), soakInFlight,
		s.kills+s.stallsMade, s.kills, s.stallsMade, soakStall, s.skipped, l.dropped.Load(), s.held, soakLeftFresh,
		tl.ok, tl.total, 100*float64(tl.ok)/float64(tl.total), tl.codes, tl.stuck, churnTimeout, tl.slowest.Round(time.Millisecond),
		heapSlope, len(xs), plan.Warmup, mib(base.heap), mib(last.heap), mib(s.peakHeap),
		base.goroutines, last.goroutines, 100*float64(last.goroutines-base.goroutines)/float64(base.goroutines), goroutineBound, base.conns, last.conns, fds,
		s.peakScores, s.peakTargets, capEntries, len(router.Host().Peerstore().Peers()), tn.Len(), s.kills)
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// soakLoad sends the requests, on its own goroutine (launch), each request on one more
// (wg's), and draws the faults they bring along, for the test's goroutine to make.
type soakLoad struct {
	t      *testing.T // the requests' ends are counted on it
	client *http.Client
	api    string
	bodies [soakSeeds]string
	refs   [soakSeeds]string
	rng    *rand.Rand // launch's only

	faults   chan struct{} // a fault to make; dropped (never blocks a request) when full
	dropped  atomic.Int64  // faults drawn but dropped
	paused   atomic.Bool   // while set, ticks send nothing (quiet measurements)
	inflight atomic.Int64
	capped   atomic.Int64 // ticks that found soakInFlight requests open

	stop     chan struct{} // closed by halt: ends launch
	haltOnce sync.Once
	wg       sync.WaitGroup // launch and every request

	// tally counts the requests as they end (a slice of every one would grow the heap the
	// test measures by some 0.1 MiB a minute).
	mu    sync.Mutex
	tally churnTally
}

// launch sends a request every soakEvery until stop; each request ends within
// churnTimeout.
func (l *soakLoad) launch() {
	tick := time.NewTicker(soakEvery)
	defer tick.Stop()
	for k := 0; ; k++ {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		if l.paused.Load() {
			continue
		}
		if l.inflight.Load() >= soakInFlight {
			l.capped.Add(1)
			continue
		}
		if l.rng.Float64() < soakFaultP {
			select {
			case l.faults <- struct{}{}:
			default:
				l.dropped.Add(1)
			}
		}
		seed := k % soakSeeds
		l.inflight.Add(1)
		l.wg.Go(func() {
			defer l.inflight.Add(-1)
			r := churnRequest(l.client, l.api, l.bodies[seed], l.refs[seed])
			l.mu.Lock()
			l.tally.add(l.t, r)
			l.mu.Unlock()
		})
	}
}

// halt stops the load and waits for every request to end.
func (l *soakLoad) halt() {
	l.haltOnce.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// soaker makes the faults and samples the process, on the test's goroutine.
type soaker struct {
	t      *testing.T
	tn     *Testnet
	router *node.Node
	stalls *stallSet
	rng    *rand.Rand

	running []int                 // serving peers' indices
	thawAt  map[int]time.Time     // stalled peers and when they heal
	left    map[peer.ID]time.Time // every peer killed, and when
	kills   int
	// stallsMade counts stalls; held, kills made a stall instead while soakLeftFresh killed
	// peers were still fresh at the router (as TestChurn holds its leaves); skipped, faults
	// with no peer to take out while another stays healthy.
	stallsMade, held, skipped int

	samples                 []soakSample
	peakHeap                uint64
	peakScores, peakTargets int
}

type soakSample struct {
	at     time.Time
	heap   uint64 // live heap after a runtime.GC, bytes
	fitted bool   // taken after the warm-up
}

// fault takes a peer out: a kill and a stall in turn, the other kind when the turn's is
// not possible.
func (s *soaker) fault() {
	if s.kills <= s.stallsMade {
		if s.kill() || s.stall() {
			return
		}
	} else if s.stall() || s.kill() {
		return
	}
	s.skipped++
}

// victim picks a running peer, not stalled, such that another one the router can route to
// (fresh, connected, accepting, not stalled) stays; -1 when there is none.
func (s *soaker) victim() int {
	up := func(i int) bool { _, frozen := s.thawAt[i]; return !frozen }
	var victims []int
	for _, v := range s.running {
		if up(v) && slices.ContainsFunc(s.running, func(o int) bool { return o != v && up(o) && routable(s.router, s.tn.Node(o)) }) {
			victims = append(victims, v)
		}
	}
	if len(victims) == 0 {
		return -1
	}
	return victims[s.rng.IntN(len(victims))]
}

// kill crashes a peer (Testnet.Kill) and starts a new one in its place.
func (s *soaker) kill() bool {
	if stillFresh(s.router, s.left) >= soakLeftFresh {
		s.held++
		return false
	}
	v := s.victim()
	if v < 0 {
		return false
	}
	id := s.tn.Node(v).ID()
	if err := s.tn.Kill(v); err != nil {
		s.t.Fatalf("kill of node %d: %v", v, err)
	}
	s.left[id] = time.Now()
	s.stalls.remove(v)
	idx, err := s.tn.Add()
	if err != nil {
		s.t.Fatalf("replacement of node %d: %v", v, err)
	}
	s.running = append(slices.DeleteFunc(s.running, func(o int) bool { return o == v }), idx)
	s.kills++
	return true
}

// stall freezes a peer's backend for soakStall.
func (s *soaker) stall() bool {
	v := s.victim()
	if v < 0 {
		return false
	}
	s.stalls.get(v).freeze()
	s.thawAt[v] = time.Now().Add(soakStall)
	s.stallsMade++
	return true
}

// heal thaws the stalled peers due by now (every peer with now zero).
func (s *soaker) heal(now time.Time) {
	for v, at := range s.thawAt {
		if now.IsZero() || !now.Before(at) {
			s.stalls.get(v).thaw()
			delete(s.thawAt, v)
		}
	}
}

// sample takes one heap sample (for the fit when fitted) and checks the reputation store.
func (s *soaker) sample(now time.Time, fitted bool) {
	h := liveHeap()
	s.samples = append(s.samples, soakSample{at: now, heap: h, fitted: fitted})
	s.peakHeap = max(s.peakHeap, h)
	st := s.router.Reputation().Stats(time.Now())
	s.peakScores, s.peakTargets = max(s.peakScores, st.Peers), max(s.peakTargets, st.Targets)
}

// quiet is the process measured with no request open, no peer stalled, the mesh converged.
type quiet struct {
	goroutines int
	fds        int // -1: not counted (fdsSkipped)
	heap       uint64
	// conns is the connections of every running node, summed: each is 6-7 goroutines
	// (yamux, identify, GossipSub's per-peer loops), so it tells a drift in goroutines that
	// follows the mesh's shape from one that does not.
	conns int
}

// quiet waits for the load to pause (the caller has paused or halted it), heals every
// stall, waits for the mesh to converge and takes the least of quietReadings readings.
func (s *soaker) quiet(l *soakLoad) quiet {
	within(s.t, churnTimeout+5*time.Second, "the requests in flight to end", func() bool { return l.inflight.Load() == 0 })
	s.heal(time.Time{})
	l.client.CloseIdleConnections()
	within(s.t, 30*time.Second, "the mesh to converge", s.tn.Converged)
	// Every node forgets the killed peers (ForgetAfter: 6 s at the 1 s heartbeat), so
	// that neither measurement counts a dial or a record of one on its way out.
	within(s.t, 30*time.Second, "the killed peers forgotten", func() bool {
		for _, n := range s.tn.Running() {
			for id := range s.left {
				if _, ok := n.Registry().Get(id, time.Now()); ok {
					return false
				}
			}
		}
		return true
	})
	// Each connection is 6-7 goroutines, and the mesh's shape drifts: two nodes that
	// dialled each other at once keep both connections (libp2p does not merge them), and a
	// pair may have none (each knows the other through the rest). One connection a pair at
	// both measurements, so that the goroutines compare the same mesh (two 10-minute runs
	// had 46 → 42 and 42 → 40 connections: −21 and −24 goroutines, none of them a leak).
	within(s.t, 10*time.Second, "one connection between each pair of nodes", s.oneConnEach)
	q := quiet{goroutines: math.MaxInt, fds: math.MaxInt, heap: math.MaxUint64}
	tick := time.NewTicker(quietEvery)
	defer tick.Stop()
	for range quietReadings {
		<-tick.C
		q.goroutines = min(q.goroutines, runtime.NumGoroutine())
		q.fds = min(q.fds, openFDs())
		q.heap = min(q.heap, liveHeap())
	}
	for _, n := range s.tn.Running() {
		q.conns += len(n.Host().Network().Conns())
	}
	if dir := os.Getenv(soakProfEnv); dir != "" {
		q.profile(s.t, dir)
	}
	return q
}

// soakProfEnv names a directory for a heap profile at each quiet measurement, to find what
// a slope is made of: `go tool pprof -base <warm-up's> <end's>` lists what grew.
const soakProfEnv = "SOAK_HEAP_PROFILES"

// profile writes the heap's profile, after a full collection, to dir.
func (q quiet) profile(t *testing.T, dir string) {
	runtime.GC()
	name := filepath.Join(dir, fmt.Sprintf("heap-%d.pb.gz", time.Now().UnixNano()))
	f, err := os.Create(name)
	if err != nil {
		t.Fatalf("heap profile: %v", err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		t.Fatalf("heap profile: %v", err)
	}
	t.Logf("heap profile written to %s", name)
}

// oneConnEach connects every two running nodes that are not, closes every connection
// between two but their oldest, and reports whether each pair had exactly one already.
func (s *soaker) oneConnEach() bool {
	one := true
	running := s.tn.Running()
	for _, n := range running {
		nw := n.Host().Network()
		for _, o := range running {
			if o == n || nw.Connectedness(o.ID()) == network.Connected {
				continue
			}
			one = false
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			n.Host().Connect(ctx, peer.AddrInfo{ID: o.ID(), Addrs: o.Host().Addrs()}) // checked on the next call
			cancel()
		}
		for _, p := range nw.Peers() {
			conns := nw.ConnsToPeer(p)
			if len(conns) < 2 {
				continue
			}
			one = false
			slices.SortFunc(conns, func(a, b network.Conn) int { return a.Stat().Opened.Compare(b.Stat().Opened) })
			for _, c := range conns[1:] {
				c.Close()
			}
		}
	}
	return one
}

// liveHeap is the heap's live bytes, after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// fdsSkipped says why openFDs counts nothing where it does.
const fdsSkipped = "no /proc/self/fd (Linux only)"

// openFDs counts the process's open file descriptors, -1 where /proc/self/fd is missing.
// The count includes the descriptor of the directory being read, at both ends alike.
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

// stallSet is the stall switch of every serving peer, by node index: Options.Configure
// adds them (concurrently, in New's start waves), the soaker flips them.
type stallSet struct {
	mu sync.Mutex
	m  map[int]*stall
}

func (ss *stallSet) add(i int) *stall {
	s := &stall{}
	ss.mu.Lock()
	ss.m[i] = s
	ss.mu.Unlock()
	return s
}

func (ss *stallSet) get(i int) *stall {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.m[i]
}

// remove forgets a killed peer's switch, so that hundreds of kills keep none.
func (ss *stallSet) remove(i int) {
	ss.mu.Lock()
	delete(ss.m, i)
	ss.mu.Unlock()
}

// stall freezes a peer's generation: while frozen, every token waits for the thaw or its
// request's end. The node's host and announcements go on, as with a process that stops
// computing (a GPU hang, a swap storm) but not answering.
type stall struct {
	mu     sync.Mutex
	thawed chan struct{} // nil when not frozen; closed at the thaw
}

func (s *stall) freeze() {
	s.mu.Lock()
	if s.thawed == nil {
		s.thawed = make(chan struct{})
	}
	s.mu.Unlock()
}

func (s *stall) thaw() {
	s.mu.Lock()
	if s.thawed != nil {
		close(s.thawed)
		s.thawed = nil
	}
	s.mu.Unlock()
}

// frozen is the channel to wait on, nil when not frozen.
func (s *stall) frozen() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.thawed
}

// stalled is a backend under a stall switch. Like frozenAt it hides the inner backend's
// Load: a stalled peer is a fault, speculation on it is not needed.
type stalled struct {
	inference.Backend
	s *stall
}

func (b stalled) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	return b.Backend.Generate(ctx, req, func(tok inference.Token) error {
		if ch := b.s.frozen(); ch != nil {
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return emit(tok)
	})
}
