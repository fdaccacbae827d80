package dispatch

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/reputation"
)

// A request's time limit (Prefs.Timeout: the API gives its context a deadline) is the
// viability gate's budget: a stream cut after three tokens is decided on with the time left
// before the deadline, as /api/status "migration" shows; without a deadline the budget is 0
// (none).
func TestDeadlineIsTheGatesBudget(t *testing.T) {
	const limit = 30 * time.Second
	for _, tt := range []struct {
		name     string
		deadline bool
	}{{"with a time limit", true}, {"without", false}} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				req := chat(model, 12)
				want := reference(t, model, req)
				cut, next := newTarget(t, model), newTarget(t, model)
				cut.cutAfter = 3
				d := firstOn(t, peers{"cut": cut, "next": next}, "cut", "cut", "next")
				ctx := context.Background()
				if tt.deadline {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, limit)
					defer cancel()
				}
				var got []inference.Token
				_, _, err := d.Generate(ctx, req, func(_ inference.Served, tok inference.Token) error {
					got = append(got, tok)
					return nil
				})
				if err != nil || texts(got) != texts(want) {
					t.Fatalf("resumed: %v\n got %s\nwant %s", err, texts(got), texts(want))
				}
				m := d.Migration()
				if len(m.Recent) != 1 {
					t.Fatalf("%d gate decisions, want 1 (the cut): %+v", len(m.Recent), m.Recent)
				}
				budget := m.Recent[0].Inputs.BudgetMS
				switch {
				case tt.deadline && (budget <= 0 || budget > float64(limit/time.Millisecond)):
					t.Fatalf("budget %v ms with a %s time limit, want in (0, %d]", budget, limit, limit/time.Millisecond)
				case !tt.deadline && budget != 0:
					t.Fatalf("budget %v ms without a time limit, want 0 (none)", budget)
				}
			})
		})
	}
}

// A request whose time limit passes while a slow peer works on it ends with timeout, and
// the peer is not held to the client's limit: no penalty, no cooldown, no degraded route.
func TestDeadlineIsNotThePeersFault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := newTarget(t, model)
		slow.firstToken = 10 * time.Second
		rep := newRep(t)
		var degraded atomic.Int32
		d := newExecutor(t, Config{Peers: peers{"slow": slow}, Registry: registryOf(model, "slow"), Rep: rep, Seed: 1,
			Degraded: func() { degraded.Add(1) }})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, at, err := d.Generate(ctx, chat(model, 4), func(inference.Served, inference.Token) error { return nil })
		if inference.CodeOf(err) != inference.CodeTimeout || at.Peer != id("slow") {
			t.Fatalf("the time limit passed on the peer: %v at %+v, want timeout at the peer", err, at)
		}
		if st, ok := rep.TargetHealth(reputation.Target{Model: model, Peer: id("slow")}, time.Now()); ok && (st.Cooling || st.Penalty > 0 || st.Streak > 0) {
			t.Fatalf("the peer was held to the client's time limit: %+v", st)
		}
		if n := degraded.Load(); n != 0 {
			t.Fatalf("the client's time limit reported a degraded route %d times", n)
		}
	})
}
