package testnet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/node"
)

// freezer stops the first stream that reaches token index at until its context ends (its
// requester gave up on it), and lets every other stream pass: a peer frozen mid-stream,
// its host and connections alive. Like gated it hides the inner backend's Load.
type freezer struct {
	at     int
	once   sync.Once
	frozen chan struct{} // closed when a stream stopped at the token, at frozenAt
	thawed chan struct{} // closed when that stream's context ended, at thawedAt

	frozenAt, thawedAt time.Time // each written before its channel is closed
}

// startFrozen starts a converged testnet of a router (node 0, serving nothing) and
// nodes−1 peers serving synth-tiny, every node with the inter-token timeout interToken;
// the first stream of any of them to reach token index at freezes there.
func startFrozen(t *testing.T, nodes, at int, interToken time.Duration) (*Testnet, *freezer) {
	t.Helper()
	f := &freezer{at: at, frozen: make(chan struct{}), thawed: make(chan struct{})}
	tn := start(t, Options{Nodes: nodes, NoConsole: true, Heartbeat: time.Second, ModelsFor: serveNothing,
		Configure: func(_ int, cfg *node.Config) {
			cfg.WrapBackend = func(b inference.Backend) inference.Backend { return frozenAt{b, f} }
			cfg.PeerInterTokenTimeout = interToken
		}})
	within(t, 15*time.Second, "converge", tn.Converged)
	return tn, f
}

type frozenAt struct {
	inference.Backend
	f *freezer
}

func (b frozenAt) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	return b.Backend.Generate(ctx, req, func(tok inference.Token) error {
		if tok.Index == b.f.at {
			first := false
			b.f.once.Do(func() { first = true })
			if first {
				b.f.frozenAt = time.Now()
				close(b.f.frozen)
				<-ctx.Done()
				b.f.thawedAt = time.Now()
				close(b.f.thawed)
				return ctx.Err()
			}
		}
		return emit(tok)
	})
}

// F1, the frozen variant: the serving peer stops mid-stream without closing anything (what
// SIGSTOP does to a process; this testnet runs its nodes in one process, so the freeze is
// its backend's, its host answering on). The router finds it within its inter-token
// timeout plus 0.5 s (F1's figure: from the freeze to the frozen stream's reset reaching
// the peer), cancels its stream and resumes on the other peer within 5 s (F1's failover
// figure): the client sees one stall of about that timeout and a stream identical to the
// reference, and the frozen peer cools down.
func TestStreamResumesAfterPeerFrozen(t *testing.T) {
	const (
		interToken = time.Second
		frozenTok  = 5
		detectBy   = interToken + 500*time.Millisecond
		failoverBy = 5 * time.Second
	)
	tn, fr := startFrozen(t, 3, frozenTok, interToken)
	router := tn.Node(0)
	body := routedBody("synth-tiny", 32, 3, nil)
	var (
		frozen     string    // the route at the token before the freeze
		lastBefore time.Time // when that token came
		stall      time.Duration
	)
	r := stream(t, router.APIAddr(), body, nil, func(n int, route string) {
		switch n {
		case frozenTok:
			frozen, lastBefore = route, time.Now()
		case frozenTok + 1:
			stall = time.Since(lastBefore)
		}
	})
	t.Logf("stall at token %d: %v (inter-token timeout %v); stream took %v, %d attempts", frozenTok, stall, interToken, r.duration, r.final.Attempts)
	select {
	case <-fr.frozen:
	default:
		t.Fatalf("no stream reached token %d: %+v", frozenTok, r)
	}
	if r.errCode != "" || !r.done {
		t.Fatalf("error %q done %v after %d tokens", r.errCode, r.done, len(r.tokens))
	}
	if want := reference(t, body); r.text() != want {
		t.Fatalf("resumed stream differs from the reference\n got %q\nwant %q", r.text(), want)
	}
	if r.final.Route == frozen || r.final.Attempts < 2 {
		t.Fatalf("final route %s after %d attempts; frozen %s", r.final.Route, r.final.Attempts, frozen)
	}
	// The router gave up on the frozen stream (reset it), so the peer's generation ended.
	within(t, 10*time.Second, "the frozen stream to be cancelled", func() bool {
		select {
		case <-fr.thawed:
			return true
		default:
			return false
		}
	})
	detected := fr.thawedAt.Sub(fr.frozenAt)
	t.Logf("frozen stream reset %v after the freeze", detected)
	if detected > detectBy {
		t.Fatalf("frozen stream reset %v after the freeze, want within %v", detected, detectBy)
	}
	if stall < interToken || stall > failoverBy {
		t.Fatalf("stall %v at the frozen peer, want the inter-token timeout %v, and the stream on within %v", stall, interToken, failoverBy)
	}
	st := router.Status()
	if st.Routing.Resumptions < 1 || st.RoutingAffinity.TargetReputation.CoolingTargets < 1 {
		t.Fatalf("routing %+v, %+v: want a resumption and the frozen peer cooling down", st.Routing, st.RoutingAffinity)
	}
	t.Logf("figure F1: in process, frozen: stream reset %v after the freeze, client stall %v (inter-token timeout %v), identical",
		detected.Round(time.Millisecond), stall.Round(time.Millisecond), interToken)
}

// With no other peer to go on, a stream frozen mid-stream ends with a timeout error event
// within the inter-token timeout plus 1 s (F1's figure for no alternative): never a hang.
func TestFrozenPeerWithoutAlternativeTimesOut(t *testing.T) {
	const interToken, frozenTok, slack = time.Second, 3, time.Second
	tn, _ := startFrozen(t, 2, frozenTok, interToken)
	var lastBefore time.Time
	r := stream(t, tn.Node(0).APIAddr(), routedBody("synth-tiny", 32, 4, nil), nil, func(n int, _ string) {
		if n == frozenTok {
			lastBefore = time.Now()
		}
	})
	took := time.Since(lastBefore)
	t.Logf("error %q %v after the last token (inter-token timeout %v)", r.errCode, took, interToken)
	if lastBefore.IsZero() || r.errCode != "timeout" || r.done || len(r.tokens) != frozenTok {
		t.Fatalf("want a timeout error event after %d tokens; got %+v", frozenTok, r)
	}
	if took < interToken || took > interToken+slack {
		t.Fatalf("timeout %v after the last token, want the inter-token timeout %v (+ at most %v)", took, interToken, slack)
	}
	t.Logf("figure F1: in process, frozen, no alternative: %s %v after the last token (inter-token timeout %v)", r.errCode, took.Round(time.Millisecond), interToken)
}
