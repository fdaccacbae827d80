package dispatch

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/reputation"
)

// The executor's rules on virtual time (testing/synctest) with in-memory targets running the
// real synthetic model: cold starts, first-token delays and cooldowns take no wall time.

const model = "synth-tiny"

// A peer that fails before its first token costs the client nothing: the request moves to
// the next peer (failover) and the client sees one whole stream; the failed peer then cools
// down and is left out while another peer can serve. Once its cooldown is over it is a
// candidate again, behind the clean peer while its penalty lasts (NODE_REP): tried when
// that one fails.
func TestFailoverThenCooldown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bad, good := newTarget(t, model), newTarget(t, model)
		bad.failBefore = inference.Errorf(inference.CodeUnavailable, "model unloaded")
		ps := peers{"bad": bad, "good": good}
		d := newExecutor(t, Config{Peers: ps, Registry: registryOf(model, "bad", "good"), Rep: newRep(t), Seed: 1})
		req := chat(model, 8)
		want := reference(t, model, req)

		// Until the router draws the bad peer first, once.
		for i := 0; bad.calledTimes() == 0; i++ {
			if i == 64 {
				t.Fatal("64 requests never drew the bad peer first")
			}
			got, _, at, err := collect(d, req)
			if err != nil || texts(got) != texts(want) || at.Peer != id("good") {
				t.Fatalf("request %d: %v, served at %+v, got %s", i, err, at, texts(got))
			}
			if bad.calledTimes() == 1 && (at.Attempts != 2 || d.stats.failovers.Load() != 1) {
				t.Fatalf("after the failure: attempts %d, failovers %d; want 2 and 1", at.Attempts, d.stats.failovers.Load())
			}
		}
		// Cooling: left out while the good peer serves.
		for i := range 20 {
			if _, _, at, err := collect(d, req); err != nil || at.Peer != id("good") || at.Attempts != 1 {
				t.Fatalf("cooling request %d: %v at %+v", i, err, at)
			}
		}
		if n := bad.calledTimes(); n != 1 {
			t.Fatalf("a cooling peer was tried %d times, want once", n)
		}
		// Past the longest cooldown it is a candidate again, behind the clean peer.
		time.Sleep(reputation.DefaultCooldownMax + time.Second)
		for i := range 20 {
			if _, _, at, err := collect(d, req); err != nil || at.Peer != id("good") || at.Attempts != 1 {
				t.Fatalf("penalized request %d: %v at %+v; want the clean peer first", i, err, at)
			}
		}
		routed := d.cfg.Rep.Stats(time.Now()).RoutesPenalized
		if routed < 20 {
			t.Fatalf("routes_penalized %d after 20 decisions that put the bad peer behind the good one", routed)
		}
		bad.failBefore = nil
		good.failBefore = inference.Errorf(inference.CodeUnavailable, "model unloaded")
		if got, _, at, err := collect(d, req); err != nil || at.Peer != id("bad") || at.Attempts != 2 || texts(got) != texts(want) {
			t.Fatalf("with the clean peer failing: %v at %+v; want the recovered peer second", err, at)
		}
	})
}

// When every candidate is cooling, the request still goes to them in order instead of
// failing without a try; when all fail, the client gets the last typed error.
func TestEveryCandidateCooling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := newTarget(t, model), newTarget(t, model)
		a.failBefore = inference.Errorf(inference.CodeUnavailable, "gone")
		b.failBefore = inference.Errorf(inference.CodeTimeout, "no first token")
		d := newExecutor(t, Config{Peers: peers{"a": a, "b": b}, Registry: registryOf(model, "a", "b"), Rep: newRep(t), Seed: 1})
		for round := 1; round <= 2; round++ {
			_, _, at, err := collect(d, chat(model, 4))
			if c := inference.CodeOf(err); c != inference.CodeUnavailable && c != inference.CodeTimeout {
				t.Fatalf("round %d: error %v, want unavailable or timeout", round, err)
			}
			if at.Attempts != 2 || a.calledTimes() != round || b.calledTimes() != round {
				t.Fatalf("round %d: attempts %d, calls %d and %d; want both peers tried", round, at.Attempts, a.calledTimes(), b.calledTimes())
			}
		}
		if d.stats.probeReruns.Load() == 0 {
			t.Fatal("a timing-out peer did not report a degraded route")
		}
	})
}

// A peer excluded by its score (under 40) is never tried, not even when it is the only
// one: the request gets model_not_found instead.
func TestExcludedPeerNeverTried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		liar, honest := newTarget(t, model), newTarget(t, model)
		rep := newRep(t)
		rep.Observe(id("liar"), reputation.VerificationFailed, time.Now())
		if !rep.Excluded(id("liar"), time.Now()) {
			t.Fatal("a failed verification did not exclude the peer")
		}
		d := newExecutor(t, Config{Peers: peers{"liar": liar, "honest": honest}, Registry: registryOf(model, "liar", "honest"), Rep: rep, Seed: 3})
		for i := range 50 {
			if _, _, at, err := collect(d, chat(model, 2)); err != nil || at.Peer != id("honest") {
				t.Fatalf("request %d: %v at %+v", i, err, at)
			}
		}
		alone := newExecutor(t, Config{Peers: peers{"liar": liar}, Registry: registryOf(model, "liar"), Rep: rep, Seed: 3})
		if _, _, _, err := collect(alone, chat(model, 2)); inference.CodeOf(err) != inference.CodeModelNotFound {
			t.Fatalf("only the excluded peer serves: %v, want model_not_found", err)
		}
		if n := liar.calledTimes(); n != 0 {
			t.Fatalf("the excluded peer was tried %d times", n)
		}
	})
}

// firstOn finds a seed whose decision tries peer first among ps, and returns an executor
// with it.
func firstOn(t *testing.T, ps peers, first peer.ID, ids ...peer.ID) *Executor {
	t.Helper()
	for seed := uint64(1); seed < 256; seed++ {
		d := newExecutor(t, Config{Peers: ps, Registry: registryOf(model, ids...), Rep: newRep(t), Seed: seed})
		snap, _ := d.snapshot(context.Background(), time.Now())
		if dec := d.decide(chat(model, 1), snap, time.Now()); len(dec.Attempts) > 0 && dec.Attempts[0].Peer == first {
			return newExecutor(t, Config{Peers: ps, Registry: registryOf(model, ids...), Rep: newRep(t), Seed: seed})
		}
	}
	t.Fatalf("no seed puts %s first", first)
	return nil
}

// A stream cut after three tokens resumes on another deterministic peer: the new peer
// regenerates, the three tokens the client has are checked against it and skipped, and the
// client sees one contiguous stream identical to an uncut run. A peer whose regenerated
// prefix differs ends the request with verification_failed instead.
func TestResumeChecksThePrefix(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		req := chat(model, 12)
		want := reference(t, model, req)

		cut, next := newTarget(t, model), newTarget(t, model)
		cut.cutAfter = 3
		d := firstOn(t, peers{"cut": cut, "next": next}, "cut", "cut", "next")
		got, from, at, err := collect(d, req)
		if err != nil || texts(got) != texts(want) {
			t.Fatalf("resumed: %v\n got %s\nwant %s", err, texts(got), texts(want))
		}
		for i, s := range from {
			wantPeer, wantAttempts := id("next"), 2
			if i < 3 {
				wantPeer, wantAttempts = id("cut"), 1
			}
			if s.Peer != wantPeer || s.Attempts != wantAttempts || s.Tier != inference.TierMesh || s.Transport != inference.TransportLibp2p {
				t.Fatalf("token %d served at %+v, want %s attempt %d", i, s, wantPeer, wantAttempts)
			}
		}
		if at.Peer != id("next") || d.stats.resumptions.Load() != 1 {
			t.Fatalf("ended at %+v with %d resumptions", at, d.stats.resumptions.Load())
		}

		cut2, liar := newTarget(t, model), newTarget(t, model)
		cut2.cutAfter, liar.alter = 3, 2 // the liar's second token differs
		d = firstOn(t, peers{"cut": cut2, "liar": liar}, "cut", "cut", "liar")
		got, _, _, err = collect(d, req)
		if inference.CodeOf(err) != inference.CodeVerificationFailed || len(got) != 3 || d.stats.resumeMismatches.Load() != 1 {
			t.Fatalf("a differing prefix: %v after %d tokens, %d mismatches; want verification_failed after 3", err, len(got), d.stats.resumeMismatches.Load())
		}
	})
}

// speculative is an executor whose local model is cold (loading takes load) and whose cloud
// answers its first token after cloudFirst.
func speculative(t *testing.T, load, cloudFirst time.Duration) (*Executor, *synth.Backend, *target) {
	t.Helper()
	local, err := synth.NewWith([]string{model}, []synth.Option{synth.WithLoadDelay(load)})
	if err != nil {
		t.Fatal(err)
	}
	cloud := newTarget(t, model)
	cloud.firstToken = cloudFirst
	d := newExecutor(t, Config{Local: local, Peers: peers{}, Registry: entries{}, Rep: newRep(t),
		Cloud: cloud, CloudModels: []string{model}, Seed: 1})
	return d, local, cloud
}

func anyPrivacy(req *inference.Request) *inference.Request {
	req.Prefs.Privacy = inference.PrivacyAny
	return req
}

// Speculation, the cloud first: a cold local model loads while the cloud streams; the cloud's
// first token comes before the load ends, so the cloud serves the whole request, and the load
// goes on in the background so the next request runs warm on this device.
func TestSpeculationCloudWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, local, _ := speculative(t, 5*time.Second, 100*time.Millisecond)
		_, from, at, err := collect(d, anyPrivacy(chat(model, 6)))
		if err != nil || at.Tier != inference.TierCloud || len(from) == 0 || from[0].Tier != inference.TierCloud {
			t.Fatalf("cold local, quick cloud: %v at %+v", err, at)
		}
		if s := &d.stats; s.specStarted.Load() != 1 || s.specKept.Load() != 1 || s.specCancelled.Load() != 0 {
			t.Fatalf("speculation counters started %d kept %d cancelled %d", s.specStarted.Load(), s.specKept.Load(), s.specCancelled.Load())
		}
		time.Sleep(5 * time.Second) // the load, finishing in the background
		synctest.Wait()
		if ms, _ := local.Models(context.Background()); !ms[0].Warm {
			t.Fatal("the local model did not finish loading after the cloud won")
		}
		if _, _, at, err := collect(d, anyPrivacy(chat(model, 6))); err != nil || at.Tier != inference.TierLocal {
			t.Fatalf("warm local: %v at %+v, want local", err, at)
		}
	})
}

// Speculation, local first: the local model is ready before the cloud's first token, so the
// cloud stream is cancelled and the request runs on this device.
func TestSpeculationLocalWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, _, cloud := speculative(t, time.Second, 10*time.Second)
		start := time.Now()
		_, from, at, err := collect(d, anyPrivacy(chat(model, 6)))
		if err != nil || at.Tier != inference.TierLocal || slices.ContainsFunc(from, func(s inference.Served) bool { return s.Tier != inference.TierLocal }) {
			t.Fatalf("quick local load, slow cloud: %v at %+v", err, at)
		}
		if took := time.Since(start); took >= 10*time.Second {
			t.Fatalf("the request waited %v, as long as the cloud's first token", took)
		}
		if s := &d.stats; s.specCancelled.Load() != 1 || s.specKept.Load() != 0 || cloud.calledTimes() != 1 {
			t.Fatalf("speculation counters cancelled %d kept %d, cloud calls %d", s.specCancelled.Load(), s.specKept.Load(), cloud.calledTimes())
		}
	})
}

// id is the string form of the test peer ID p.
func id(p peer.ID) string { return p.String() }

// A request whose peer failed before streaming takes its next peers from a decision made
// then, not from the one made when it began: a peer that other requests found gone in the
// meantime is passed over, and one that came since is tried. Whichever of a and b the
// request draws first fails after the other was found gone and c joined; the request must
// complete on c. Decided once, its second attempt would go to the gone peer.
func TestFailoverDecidesAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b, c := newTarget(t, model), newTarget(t, model), newTarget(t, model)
		gone := inference.Errorf(inference.CodeUnavailable, "peer gone")
		a.failBefore, b.failBefore = gone, gone
		rep := newRep(t)
		var joined atomic.Bool
		reg := registryFunc(func(time.Time) []registry.Entry {
			if joined.Load() {
				return registryOf(model, "a", "b", "c")
			}
			return registryOf(model, "a", "b")
		})
		ps := peerFunc(func(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
			if p != "c" && !joined.Load() {
				// While the first attempt runs, another request finds the other peer gone,
				// and c joins.
				other := map[peer.ID]peer.ID{"a": "b", "b": "a"}[p]
				rep.Record(reputation.Target{Model: model, Peer: other.String()}, reputation.Unavailable, time.Now())
				joined.Store(true)
			}
			return peers{"a": a, "b": b, "c": c}.Generate(ctx, p, req, emit)
		})
		d := newExecutor(t, Config{Peers: ps, Registry: reg, Rep: rep, Seed: 1})
		req := chat(model, 8)
		want := reference(t, model, req)
		got, _, at, err := collect(d, req)
		if err != nil || at.Peer != id("c") || texts(got) != texts(want) {
			t.Fatalf("%v, served at %+v, got %s; want c's whole stream", err, at, texts(got))
		}
		if n := a.calledTimes() + b.calledTimes(); n != 1 {
			t.Fatalf("a and b were tried %d times, want once: the gone peer was tried", n)
		}
	})
}

// registryFunc is a registry that answers with a function.
type registryFunc func(time.Time) []registry.Entry

func (f registryFunc) Entries(now time.Time) []registry.Entry { return f(now) }

// peerFunc is a peer client that answers with a function.
type peerFunc func(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error)

func (f peerFunc) Generate(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	return f(ctx, p, req, emit)
}

// A peer holding a request of this node past SilentAfter without a first token is tried
// after the others: the requests that follow go to the other peer, not to the frozen one
// until the first one's timeout shows it. Once the waiting request ends, the peer is a
// candidate like any other again.
func TestSilentPeerTriedLast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := newTarget(t, model), newTarget(t, model)
		thaw := make(chan struct{})
		var thawOnce sync.Once
		thawed := func() { thawOnce.Do(func() { close(thaw) }) }
		defer thawed()          // also when the test fails: the first request ends
		var frozen atomic.Value // the peer that got the first request
		var later atomic.Int64  // requests the frozen peer got after it
		ps := peerFunc(func(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
			if frozen.CompareAndSwap(nil, p) {
				select {
				case <-thaw:
				case <-ctx.Done():
					return inference.Result{}, ctx.Err()
				}
			} else if frozen.Load() == p {
				later.Add(1)
				return inference.Result{}, inference.Errorf(inference.CodeTimeout, "frozen")
			}
			return peers{"a": a, "b": b}.Generate(ctx, p, req, emit)
		})
		d := newExecutor(t, Config{Peers: ps, Registry: registryOf(model, "a", "b"), Rep: newRep(t), Seed: 1})
		req := chat(model, 4)
		done := make(chan error, 1)
		go func() {
			_, _, _, err := collect(d, req)
			done <- err
		}()
		synctest.Wait() // the first request waits on its peer
		time.Sleep(DefaultSilentAfter)
		for i := range 20 {
			if _, _, at, err := collect(d, req); err != nil || at.Attempts != 1 {
				t.Fatalf("request %d beside a silent peer: %v at %+v; want the other peer, first", i, err, at)
			}
		}
		if n := later.Load(); n != 0 {
			t.Fatalf("the silent peer was tried %d times", n)
		}
		thawed()
		if err := <-done; err != nil {
			t.Fatalf("the first request: %v", err)
		}
		snap, _ := d.snapshot(context.Background(), time.Now())
		for _, p := range snap.Peers {
			if p.Silent {
				t.Errorf("peer %s still silent with no request waiting on it", p.Entry.Peer)
			}
		}
	})
}
