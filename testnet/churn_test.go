package testnet

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/reputation"
)

// churnPlan sizes one run of docs/reliability.md F19: a router (node 0, serving nothing)
// sends requests on a few concurrent streams while a loop makes a random serving peer
// leave or a new one join, every Every for For.
type churnPlan struct {
	Every, For time.Duration
	// MinPeers and MaxPeers bound the serving peers running: at MinPeers the loop only
	// adds, at MaxPeers it only removes; in between it tosses a coin. Whatever the bounds,
	// a peer leaves only while another one the router can route to stays (the catalogue's
	// "≥ 1 healthy peer always present").
	MinPeers, MaxPeers int
	Streams            int // requests in flight at once, one after another on each
	// Retain is the router's reputation Retain and Cap its MaxEntries: a Retain of
	// seconds, so that the peers that left are seen forgotten within the run.
	Retain time.Duration
	Cap    int
}

// churnShort is the version `make test` runs: an event every 500 ms for 12 s among 3-6
// serving peers, about 12 joins and leaves (the others skipped by maxLeftFresh), about 20 s
// in all with the start and the wait for the last peers to be forgotten, under -race.
var churnShort = churnPlan{Every: 500 * time.Millisecond, For: 12 * time.Second, MinPeers: 3, MaxPeers: 6,
	Streams: 3, Retain: time.Second, Cap: 32}

// churnTimeout bounds each request at the client: long enough for a first attempt on a
// peer that leaves mid-stream plus a resumption (the router's first-token timeout is 5 s
// here), far beyond a healthy request's few hundred milliseconds under -race. A request
// still open then is stuck.
const churnTimeout = 20 * time.Second

// churnOpen is the router's open timeout (node.Config.PeerOpenTimeout): a dial on loopback
// takes milliseconds, one to a peer that left fails only at libp2p's 5 s local dial timeout
// (QUIC hears nothing from a closed port), and a request routed to it before it is stale
// waits this long before trying another peer.
const churnOpen = time.Second

// churnTokens is each request's max_tokens: short requests, so that many overlap a leave.
const churnTokens = 12

// TestChurn is docs/reliability.md F19, short (churnShort; TestChurnSoak, with -tags soak,
// is the catalogue's 2 s for 2 min). The router's requests all go to peers, which join and
// leave under them: a leave is in turn a crash (Kill: the host closes every connection at
// once), a close (Stop) and a drain then close (what `meshinfer node` does on SIGTERM).
// It asserts:
//
//   - every request ends exactly once: a 200 stream whose one terminal event is a finish
//     chunk followed by [DONE], identical to the synthetic model's own output, or a typed
//     error (an error body, or one error event ending the stream) with a code of
//     inference.Codes;
//   - at least 99 % of the requests succeed, and none is still open at its timeout;
//   - the router's reputation store stays within its cap throughout (sampled at every
//     event and at the end);
//   - every peer that left is forgotten by the router, by its registry (ForgetAfter: 6 s
//     at the 1 s heartbeat) and then its reputation store (Retain after its last event,
//     pruned every heartbeat), within those periods and a few heartbeats of slack.
//
// A peer leaves only while another the router can route to stays, and while at most
// maxLeftFresh of those that left are still fresh at the router. The churn's pacing is
// wall-clock; no assertion is: everything waited for is a condition, and the bound on
// forgetting is the periods involved plus slack.
func TestChurn(t *testing.T) { runChurn(t, churnShort) }

func runChurn(t *testing.T, plan churnPlan) {
	repParams := reputation.DefaultParams()
	repParams.Retain, repParams.MaxEntries = plan.Retain, plan.Cap
	tn := start(t, Options{Nodes: 1 + plan.MinPeers, NoConsole: true, Heartbeat: fastHeartbeat, ModelsFor: serveNothing,
		Configure: func(i int, cfg *node.Config) {
			if i != 0 {
				cfg.APIAddr = node.APIOff // only the router is asked
				return
			}
			cfg.Reputation = &repParams
			cfg.PeerFirstTokenTimeout = 5 * time.Second
			cfg.PeerOpenTimeout = churnOpen
		}})
	within(t, 15*time.Second, "converge", tn.Converged)
	router := tn.Node(0)

	const seeds = 4
	var refs [seeds]string
	for s := range seeds {
		refs[s] = reference(t, routedBody("synth-tiny", churnTokens, int64(s), nil))
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: plan.Streams}}
	defer client.CloseIdleConnections()

	var (
		mu   sync.Mutex
		runs []churnRun
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Also on a failure in the churn below: no request outlives the test.
	stopStreams := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopStreams()
	for w := range plan.Streams {
		wg.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				seed := (w + k) % seeds
				r := churnRequest(client, router.APIAddr(), routedBody("synth-tiny", churnTokens, int64(seed), nil), refs[seed])
				mu.Lock()
				runs = append(runs, r)
				mu.Unlock()
			}
		})
	}

	c := &churner{t: t, tn: tn, router: router, plan: plan, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 19)),
		left: map[peer.ID]time.Time{}}
	for i := 1; i <= plan.MinPeers; i++ {
		c.running = append(c.running, i)
	}
	tick := time.NewTicker(plan.Every)
	end := time.Now().Add(plan.For)
	for time.Now().Before(end) {
		<-tick.C
		c.event()
		c.sample()
	}
	tick.Stop()
	stopStreams()
	c.sample()

	// Every request ended (wg.Wait), each exactly once as churnRequest read it.
	tl := tallyRuns(t, runs)
	if tl.total < plan.Streams {
		t.Fatalf("%d requests in %v: each stream should have sent at least one", tl.total, plan.For)
	}
	if c.joins == 0 || slices.Contains(c.leaves[:], 0) {
		t.Fatalf("churn without every kind of event: %d joins, leaves (kill, stop, drain) %v", c.joins, c.leaves)
	}
	if c.peakScores > plan.Cap || c.peakTargets > plan.Cap {
		t.Errorf("reputation store past its cap: %d scores, %d health records, cap %d", c.peakScores, c.peakTargets, plan.Cap)
	}

	// Every peer that left is forgotten: registry after ForgetAfter (2 × (2 heartbeats +
	// 1 s)), then reputation after Retain from its last missed heartbeat; pruned every
	// heartbeat. The bound adds 3 heartbeats of slack for ticks and a loaded machine.
	forgetBy := 2*(2*fastHeartbeat+time.Second) + plan.Retain + 3*fastHeartbeat
	lastLeave := time.Time{}
	for _, at := range c.left {
		lastLeave = later(lastLeave, at)
	}
	remembered := func() (reg, rep int) {
		now := time.Now()
		for id := range c.left {
			if _, ok := router.Registry().Get(id, now); ok {
				reg++
			}
			if router.Reputation().Knows(id.String()) {
				rep++
			}
		}
		return reg, rep
	}
	within(t, time.Until(lastLeave.Add(forgetBy))+time.Second, "every peer that left forgotten", func() bool {
		reg, rep := remembered()
		return reg == 0 && rep == 0
	})
	st := router.Reputation().Stats(time.Now())
	if st.Peers > plan.Cap || st.Targets > plan.Cap {
		t.Errorf("reputation store past its cap at the end: %+v", st)
	}
	t.Logf("figure F19: a peer joined or left every %v for %v (%d joins; %d kills, %d closes, %d drains; %d leaves held and %d events skipped to keep at most %d peers that left still fresh): "+
		"%d of %d requests succeeded (%.2f %%), typed errors %v, 0 ended twice or without an end, %d stuck beyond %v (slowest %v); "+
		"reputation peak %d scores and %d health records, cap %d, %d evicted; %d of %d peers that left forgotten (registry and reputation, retain %v) within %v of the last leave",
		plan.Every, plan.For, c.joins, c.leaves[leaveKill], c.leaves[leaveStop], c.leaves[leaveDrain], c.held, c.skipped, maxLeftFresh,
		tl.ok, tl.total, 100*float64(tl.ok)/float64(tl.total), tl.codes, tl.stuck, churnTimeout, tl.slowest.Round(time.Millisecond),
		c.peakScores, c.peakTargets, plan.Cap, st.EvictedPeers+st.EvictedTargets, len(c.left), len(c.left), plan.Retain,
		time.Since(lastLeave).Round(100*time.Millisecond))
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Kinds of leave, taken in turn.
const (
	leaveKill  = iota // Testnet.Kill: the host closes every connection at once, a crash
	leaveStop         // Testnet.Stop: node.Close, tasks in flight cancelled
	leaveDrain        // node.Drain (bounded by churnDrain), then Stop: SIGTERM's path
	leaveKinds
)

// maxLeftFresh bounds the peers that left and that the router still holds fresh (not yet
// stale: 3 s after their last vector at the 1 s heartbeat), which it may still route to.
// The router tries the peers it is still connected to first (route.Peer.Unconnected), so a
// peer that left takes a request's attempt (for up to an open timeout) only when the
// connected ones failed it. Before that rule, with two or more such peers the short version
// saw 1 request in 30-50 fail unavailable, every attempt on a peer that had left, and this
// bound was 1. At the catalogue's pace (an event every 2 s) there is about one at a time;
// the short version, four times faster, allows three.
const maxLeftFresh = 3

// churnDrain bounds a drain: the requests here last tens of milliseconds.
const churnDrain = 2 * time.Second

// churner makes the joins and leaves, on the test's goroutine.
type churner struct {
	t      *testing.T
	tn     *Testnet
	router *node.Node
	plan   churnPlan
	rng    *rand.Rand

	running []int                 // serving peers' indices
	left    map[peer.ID]time.Time // every peer that left, and when
	joins   int
	leaves  [leaveKinds]int
	skipped int // events with nobody to remove and no room to add
	held    int // leaves not made, a join instead, while a peer that left was still fresh

	peakScores, peakTargets int // the router's reputation store
}

// event makes one peer join or leave.
func (c *churner) event() {
	n := len(c.running)
	leave := n >= c.plan.MaxPeers || n > c.plan.MinPeers && c.rng.IntN(2) == 0
	if leave && c.leave() {
		return
	}
	if n >= c.plan.MaxPeers {
		c.skipped++
		return
	}
	idx, err := c.tn.Add()
	if err != nil {
		c.t.Fatalf("join: %v", err)
	}
	c.running = append(c.running, idx)
	c.joins++
}

// leave removes a random peer, if another one the router can route to stays and fewer
// than maxLeftFresh of the peers that left are still fresh at the router.
func (c *churner) leave() bool {
	if stillFresh(c.router, c.left) >= maxLeftFresh {
		c.held++
		return false
	}
	var victims []int
	for _, v := range c.running {
		if slices.ContainsFunc(c.running, func(o int) bool { return o != v && c.healthy(o) }) {
			victims = append(victims, v)
		}
	}
	if len(victims) == 0 {
		return false
	}
	v := victims[c.rng.IntN(len(victims))]
	n := c.tn.Node(v)
	id := n.ID()
	kind := (c.leaves[0] + c.leaves[1] + c.leaves[2]) % leaveKinds
	var err error
	switch kind {
	case leaveKill:
		err = c.tn.Kill(v)
	case leaveStop:
		err = c.tn.Stop(v)
	case leaveDrain:
		ctx, cancel := context.WithTimeout(context.Background(), churnDrain)
		// Past the bound, the tasks left are Stop's to cancel: not a failure of the drain.
		_ = n.Drain(ctx)
		cancel()
		err = c.tn.Stop(v)
	}
	if err != nil {
		c.t.Fatalf("leave of node %d: %v", v, err)
	}
	c.running = slices.DeleteFunc(c.running, func(o int) bool { return o == v })
	c.left[id] = time.Now()
	c.leaves[kind]++
	return true
}

// healthy: the router holds peer i fresh, connected and accepting, so it can route to it.
func (c *churner) healthy(i int) bool { return routable(c.router, c.tn.Node(i)) }

// routable: router holds peer n (nil: not running) fresh, connected and accepting.
func routable(router, n *node.Node) bool {
	if n == nil {
		return false
	}
	e, ok := router.Registry().Get(n.ID(), time.Now())
	return ok && !e.Stale && e.Contacted && e.Connected && e.Vector != nil && e.Vector.Load.Accepting
}

// stillFresh counts the peers of left that the router still holds fresh (not stale), and
// may still route to.
func stillFresh(router *node.Node, left map[peer.ID]time.Time) int {
	fresh := 0
	for id := range left {
		if e, ok := router.Registry().Get(id, time.Now()); ok && !e.Stale {
			fresh++
		}
	}
	return fresh
}

func (c *churner) sample() {
	st := c.router.Reputation().Stats(time.Now())
	c.peakScores, c.peakTargets = max(c.peakScores, st.Peers), max(c.peakTargets, st.Targets)
}

// churnTally is how a set of requests ended.
type churnTally struct {
	ok, stuck, total int
	codes            map[string]int // typed errors by code
	slowest          time.Duration
}

// tallyRuns counts how runs ended, and fails t for each that did not end exactly once
// (complete or with a typed error), for any still open at churnTimeout, and when fewer
// than 99 % completed (F19's and L4's goal).
func tallyRuns(t *testing.T, runs []churnRun) churnTally {
	t.Helper()
	tl := churnTally{codes: map[string]int{}}
	for _, r := range runs {
		tl.add(t, r)
	}
	tl.check(t)
	return tl
}

// add counts how r ended, and fails t if it did not end exactly once, complete or with a
// typed error.
func (tl *churnTally) add(t *testing.T, r churnRun) {
	t.Helper()
	tl.total++
	tl.slowest = max(tl.slowest, r.took)
	switch {
	case r.bad != "":
		t.Errorf("a request did not end exactly once, complete or with a typed error: %s", r.bad)
	case r.stuck:
		tl.stuck++
	case r.code != "":
		tl.codes[r.code]++
		t.Logf("request ended with %s after %v: %s", r.code, r.took.Round(time.Millisecond), r.msg)
	default:
		tl.ok++
	}
}

// check fails t for requests still open at churnTimeout and when fewer than 99 % of those
// counted completed.
func (tl *churnTally) check(t *testing.T) {
	t.Helper()
	if tl.stuck > 0 {
		t.Errorf("%d of %d requests still open at their %v timeout", tl.stuck, tl.total, churnTimeout)
	}
	if tl.ok*100 < tl.total*99 {
		t.Errorf("%d of %d requests succeeded (%.2f %%), want ≥ 99 %%; typed errors %v", tl.ok, tl.total, 100*float64(tl.ok)/float64(max(tl.total, 1)), tl.codes)
	}
}

// churnRun is how one request ended, as its client read it.
type churnRun struct {
	took  time.Duration
	code  string // the typed error it ended with; "" when it completed
	msg   string // its message
	stuck bool   // still open at churnTimeout
	bad   string // why it did not end exactly once, complete or with a typed error
}

// churnRequest sends one streaming request and reads it to its end. A request ends exactly
// once when it gets an error body with a code of the closed set, or a 200 stream whose
// events end with exactly one terminal one: a finish chunk and [DONE] (its text identical
// to want), or an error event with a code of the closed set.
func churnRequest(client *http.Client, api, body, want string) (r churnRun) {
	ctx, cancel := context.WithTimeout(context.Background(), churnTimeout)
	defer cancel()
	began := time.Now()
	defer func() {
		r.took = time.Since(began)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			r.stuck, r.bad = true, ""
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+api+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return churnRun{bad: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return churnRun{bad: fmt.Sprintf("no response: %v", err)}
	}
	defer resp.Body.Close()
	typed := func(code string) churnRun {
		if _, ok := inference.ParseCode(code); !ok {
			return churnRun{bad: fmt.Sprintf("error code %q outside the closed set", code)}
		}
		return churnRun{code: code}
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Code, Message string }
		}
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
			return churnRun{bad: fmt.Sprintf("status %d without an error body: %v", resp.StatusCode, err)}
		}
		r := typed(e.Error.Code)
		r.msg = e.Error.Message
		return r
	}
	var (
		text      strings.Builder
		terminals []string // "finish", "error:<code>", "done", in order
		after     int      // events after the first terminal one, [DONE] and usage aside
		msg       string   // the error event's message
	)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			terminals = append(terminals, "done")
			continue
		}
		var ev chatEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			return churnRun{bad: fmt.Sprintf("event %q: %v", line, err)}
		}
		if len(terminals) > 0 && (ev.Error != nil || len(ev.Choices) > 0) {
			after++
		}
		if ev.Error != nil {
			terminals = append(terminals, "error:"+ev.Error.Code)
			msg = ev.Error.Message
		}
		for _, ch := range ev.Choices {
			if ch.Delta.Content != nil {
				text.WriteString(*ch.Delta.Content)
			}
			if ch.FinishReason != nil {
				terminals = append(terminals, "finish")
			}
		}
	}
	if err := sc.Err(); err != nil {
		return churnRun{bad: fmt.Sprintf("stream cut without a terminal event: %v (terminals %q)", err, terminals)}
	}
	switch {
	case after > 0:
		return churnRun{bad: fmt.Sprintf("%d events after the terminal one (terminals %q)", after, terminals)}
	case slices.Equal(terminals, []string{"finish", "done"}):
		if text.String() != want {
			return churnRun{bad: fmt.Sprintf("completed with %q, want the model's own %q", text.String(), want)}
		}
		return churnRun{}
	case len(terminals) == 1 && strings.HasPrefix(terminals[0], "error:"):
		r := typed(strings.TrimPrefix(terminals[0], "error:"))
		r.msg = msg
		return r
	default:
		return churnRun{bad: fmt.Sprintf("terminal events %q, want one finish and [DONE], or one error", terminals)}
	}
}
