package node

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meshinfer/meshinfer/reputation"
)

// The node's prune tick forgets a peer that left Retain after its last event, and no
// earlier; it stops when its context ends.
func TestPruneReputationForgetsThePeerThatLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const retain, period = 3 * time.Second, time.Second
		p := reputation.DefaultParams()
		p.Retain = retain
		rep, err := reputation.New(p)
		if err != nil {
			t.Fatal(err)
		}
		left := reputation.Target{Model: "m", Peer: "left"}
		rep.Record(left, reputation.Success, time.Now())
		rep.Record(left, reputation.Unavailable, time.Now()) // its last attempt, as it left
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { pruneReputation(ctx, rep, time.Now, period) })

		time.Sleep(retain - period/2)
		synctest.Wait()
		if !rep.Knows(left.Peer) {
			t.Fatal("forgotten before Retain")
		}
		time.Sleep(period)
		synctest.Wait()
		if rep.Knows(left.Peer) {
			t.Fatalf("still known %v after its last event (Retain %v, pruned every %v)", retain+period/2, retain, period)
		}
		cancel()
		wg.Wait()
	})
}
