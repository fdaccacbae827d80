package announce

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// attemptEnded reports whether the victim's attempt number n to contact p has ended: it is
// not queued or under way, and has failed n times, or been dropped after the last attempt.
func (r *rig) attemptEnded(p peer.ID, n int) bool {
	a := r.victim
	a.qmu.Lock()
	queued, failures := a.queued[p], a.failures[p]
	a.qmu.Unlock()
	if queued {
		return false
	}
	if n < contactAttempts {
		return failures == n
	}
	_, held := r.reg.Get(p, time.Now())
	return !held
}

// TestLookupOnlyForARareModelOrBeforeADrop: a pending peer that Contact cannot reach is
// looked up in the DHT (a walk that dials the peers on its way, docs/benchmarks.md B6) at
// once if it offers a model no contacted peer offers, and otherwise only on its last attempt,
// before it is dropped.
func TestLookupOnlyForARareModelOrBeforeADrop(t *testing.T) {
	type call struct {
		p      peer.ID
		lookup bool
	}
	calls := make(chan call, 64)
	noWay := errors.New("no way to the peer")
	r := newRigWith(t, 2*time.Minute, func(p *Params) {
		// The default low water (8): the victim, with one connection, wants every peer.
		p.Contact = func(_ context.Context, id peer.ID) error { calls <- call{id, false}; return noWay }
		p.Lookup = func(_ context.Context, id peer.ID) error { calls <- call{id, true}; return noWay }
	})
	pending := r.offerPending(t, "m", "rare")
	same, rare := pending[0], pending[1]
	for n := 1; n <= contactAttempts; n++ {
		if n > 1 {
			r.victim.sweep(time.Now()) // queues the pending peers again, as each heartbeat does
		}
		waitFor(t, "both peers' attempt to end", func() bool { return r.attemptEnded(same, n) && r.attemptEnded(rare, n) })
	}
	got := map[peer.ID][]bool{}
	for len(calls) > 0 {
		c := <-calls
		got[c.p] = append(got[c.p], c.lookup)
	}
	if want := []bool{false, false, false, true}; !slices.Equal(got[same], want) {
		t.Errorf("peer offering a model already offered: lookups %v, want %v (contacts, a lookup on the last)", got[same], want)
	}
	if want := []bool{false, true, false, true, false, true}; !slices.Equal(got[rare], want) {
		t.Errorf("peer offering a rare model: lookups %v, want %v (a lookup after each contact)", got[rare], want)
	}
	if _, dropped := r.victim.Contacts(); dropped != 2 {
		t.Errorf("dropped %d peers, want both", dropped)
	}
}

// TestContactsUnderWayCountTowardsLowWater: a node one connection short of its low water
// starts one contact, not one per worker; when it fails, the next pending peer is tried at
// once, not at the next heartbeat, and so on until each has been tried once.
func TestContactsUnderWayCountTowardsLowWater(t *testing.T) {
	started := make(chan peer.ID, 8)
	release := make(chan struct{}) // ends one contact under way, as a failure
	r := newRigWith(t, 2*time.Minute, func(p *Params) {
		p.ContactLowWater = 2 // the attacker's connection, and one more
		p.Contact = func(ctx context.Context, id peer.ID) error {
			started <- id
			select {
			case <-release:
			case <-ctx.Done():
			}
			return errors.New("not reached")
		}
	})
	pending := r.offerPending(t, "m", "m", "m")
	a := r.victim
	var tried []peer.ID
	for range pending {
		select {
		case p := <-started:
			tried = append(tried, p)
		case <-time.After(10 * time.Second):
			t.Fatalf("after %d contacts, no other pending peer was contacted", len(tried))
		}
		waitFor(t, "the others skipped or waiting, or a second contact", func() bool {
			a.qmu.Lock()
			defer a.qmu.Unlock()
			return len(started) > 0 || len(a.contactQ) == 0 && len(a.queued) == 1
		})
		select {
		case p := <-started:
			t.Fatalf("a second contact (%s) started while one was under way", p)
		default:
		}
		release <- struct{}{}
	}
	slices.Sort(tried)
	slices.Sort(pending)
	if !slices.Equal(tried, pending) {
		t.Fatalf("contacted %v, want each pending peer once: %v", tried, pending)
	}
}

// TestDisconnectRefillsLowWater: a pending peer not needed while this node has its fill of
// connections is contacted as soon as a connection closes and leaves it short, not at the
// next heartbeat.
func TestDisconnectRefillsLowWater(t *testing.T) {
	started := make(chan peer.ID, 8)
	r := newRigWith(t, 2*time.Minute, func(p *Params) {
		p.ContactLowWater = 2 // the attacker's connection and x's
		p.Contact = func(_ context.Context, id peer.ID) error {
			started <- id
			return errors.New("not reached")
		}
	})
	x := newHost(t, newKey(t))
	vh := r.victim.h
	if err := x.Connect(context.Background(), peer.AddrInfo{ID: vh.ID(), Addrs: vh.Addrs()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the victim to count two connections", func() bool { return len(vh.Network().Peers()) == 2 })
	p := r.offerPending(t, "m")[0]
	r.victim.qmu.Lock()
	queued := r.victim.queued[p]
	r.victim.qmu.Unlock()
	if queued || len(started) > 0 {
		t.Fatal("a peer offering no new model was queued with the low water met")
	}
	x.Network().ClosePeer(vh.ID())
	select {
	case got := <-started:
		if got != p {
			t.Fatalf("contacted %s, want the pending peer %s", got, p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the pending peer was not contacted after the disconnect")
	}
}
