package testnet

import (
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/receipts"
	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/reputation"
	"github.com/meshinfer/meshinfer/transport/gateway"
)

// coordinators makes node 0 and every node added later a coordinator that serves nothing
// and verifies every mesh task, with one API key in its data dir, recorded in keys; nodes 1
// to 4 serve synth-tiny (4 is the liar).
type coordinators struct {
	t    *testing.T
	mu   sync.Mutex
	keys map[int]string
}

func (c *coordinators) models(i int) []string {
	if i == 0 || i > 4 {
		return nil
	}
	return []string{"synth-tiny"}
}

func (c *coordinators) configure(i int, cfg *node.Config) {
	if i != 0 && i <= 4 {
		return
	}
	cfg.VerifySample = 1
	vetAtOnce(cfg)
	cfg.Roles = append(cfg.Roles, node.RoleCoordinator)
	ks, err := gateway.OpenKeys(cfg.DataDir)
	if err != nil {
		c.t.Fatal(err)
	}
	key, _, err := ks.Create("tests", time.Now())
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keys[i] = key
}

func (c *coordinators) key(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keys[i]
}

// Coordinators route a thin client's tasks to an honest majority and one liar, every task
// verified: the liar is excluded, its tasks that failed verification are metered as zero,
// and every other task is metered once with its tokens. Each event carries the serving
// peer's signed receipt over the digest of the output, countersigned by the coordinator, and
// the serving peer's own log holds the same record (same time, requester and result).
//
// Whether the liar is first caught serving a client task or verifying another peer's is
// chance: per request it serves with probability 1/4, and is picked as verifier of an honest
// peer's task with probability 3/4 × 1/3 = 1/4, so each is first half the time. Fresh
// coordinators (fresh reputation stores) join until the liar has served at least one client
// task; 20 rounds all missing it has odds of about one in a million.
func TestCoordinatorMetersReceiptsAndLiarAsZero(t *testing.T) {
	c := &coordinators{t: t, keys: map[int]string{}}
	tn := start(t, Options{Nodes: 5, NoConsole: true, Heartbeat: time.Second, ModelsFor: c.models,
		Faults: Faults{Liars: 1}, Configure: c.configure, DistinctHosts: true})
	within(t, 15*time.Second, "converge", tn.Converged)

	// Without a key: refused, and nothing is metered.
	if r := stream(t, tn.Node(0).APIAddr(), routedBody("synth-tiny", 4, 1, nil), nil, nil); r.status != http.StatusUnauthorized {
		t.Fatalf("no key: status %d", r.status)
	}
	lies := 0
	for round := 0; lies == 0; round++ {
		if round == 20 {
			t.Fatalf("the liar never served a client task in %d rounds", round)
		}
		idx := 0
		if round > 0 {
			var err error
			if idx, err = tn.Add(); err != nil {
				t.Fatal(err)
			}
		}
		lies += coordinatorRound(t, tn, idx, c.key(idx), int64(7000+100*round))
	}
	t.Logf("figure F6: the coordinator metered the liar's %d caught tasks as 0", lies)
}

// coordinatorRound sends requests through coordinator idx until it has excluded the liar
// (node 4), checks what it metered, and returns how many client tasks the liar served.
func coordinatorRound(t *testing.T, tn *Testnet, idx int, key string, seed int64) int {
	coord, liar := tn.Node(idx), tn.Node(4)
	// Connected to each serving peer, as verification voters must be: a coordinator added
	// later bootstraps to only three nodes.
	connectTo(t, coord, tn.Node(1), tn.Node(2), tn.Node(3), liar)
	within(t, 15*time.Second, "coordinator sees the serving peers", func() bool {
		seen := 0
		for _, p := range coord.Peers() {
			for i := 1; i <= 4; i++ {
				if p.PeerID == tn.Node(i).ID().String() && !p.Stale && p.Capability != nil && len(p.Capability.Models) > 0 {
					seen++
				}
			}
		}
		return seen == 4
	})
	liarRoute := "peer:" + liar.ID().String()
	auth := http.Header{"Authorization": {"Bearer " + key}}
	served := map[string]int{} // requests per route
	requests := 0
	excluded := func() bool { _, ex := peerScore(t, coord, liar); return ex }
	for i := 0; !excluded() || i < 3; i++ {
		if i == 40 {
			t.Fatalf("liar not excluded after 40 requests; verification %+v", coord.Status().Routing.Verification)
		}
		body := routedBody("synth-tiny", 8, seed+int64(i), nil)
		r := stream(t, coord.APIAddr(), body, auth, nil)
		if r.errCode != "" || !r.done {
			t.Fatalf("request %d: %+v", i, r)
		}
		served[r.final.Route]++
		requests++
		within(t, 10*time.Second, "verdict", func() bool { return verificationsInFlight(coord) == 0 })
	}
	if score, _ := peerScore(t, coord, liar); score >= reputation.ExcludeBelow {
		t.Fatalf("liar scored %v", score)
	}

	// Each task metered once, the liar's served tasks as zero, the rest with their tokens.
	type record struct {
		ev gateway.MeterEvent
		rc receipts.Receipt
	}
	usageFile := filepath.Join(tn.DataDir(idx), gateway.UsageFile)
	// Each event is recorded just after its verdict: wait for the last.
	within(t, 10*time.Second, "every task metered", func() bool {
		n := 0
		gateway.ReadEvents(usageFile, func(gateway.MeterEvent) { n++ })
		return n >= requests
	})
	var recs []record
	err := gateway.ReadEvents(usageFile, func(e gateway.MeterEvent) {
		rc, err := receipts.VerifyCountersig(coord.ID().String(), e.Receipt, e.Countersig)
		if err != nil || e.Coordinator != coord.ID().String() {
			t.Errorf("event for %s: receipt %q countersig %q by %q: %v", e.Peer, e.Receipt, e.Countersig, e.Coordinator, err)
		}
		recs = append(recs, record{e, rc})
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != requests {
		t.Fatalf("%d meter events for %d requests", len(recs), requests)
	}
	var tokensOut int64
	lies := 0
	for _, r := range recs {
		e := r.ev
		if "peer:"+r.rc.Server != e.Peer || r.rc.Requester != coord.ID().String() || r.rc.Model != e.Model {
			t.Errorf("receipt %+v for event %+v", r.rc, e)
		}
		if e.Peer == liarRoute {
			lies++
			if e.Outcome != gateway.OutcomeVerificationFailed || e.Verification != "failed" || e.TokensOut != 0 || e.Verified {
				t.Errorf("liar's task metered as %+v, want verification_failed and zero tokens", e)
			}
			continue
		}
		if e.Outcome != gateway.OutcomeCompleted || e.Verification != "passed" || !e.Verified || e.TokensOut != 8 {
			t.Errorf("honest task metered as %+v", e)
		}
		tokensOut += int64(e.TokensOut)
	}
	if lies != served[liarRoute] {
		t.Fatalf("%d liar events, the liar served %d requests", lies, served[liarRoute])
	}
	usage, err := gateway.ReadUsage(usageFile)
	if err != nil || len(usage) != 1 {
		t.Fatalf("usage %v: %v", usage, err)
	}
	for _, u := range usage {
		if u.Requests != requests || u.TokensOut != tokensOut || u.Failed != lies {
			t.Fatalf("usage %+v: want %d requests, %d tokens out, %d failed (the liar's)", u, requests, tokensOut, lies)
		}
	}

	// The serving peers hold the same records in their own logs.
	for _, r := range recs {
		idx := -1
		for i := 1; i <= 4; i++ {
			if tn.Node(i).ID().String() == r.rc.Server {
				idx = i
			}
		}
		// A serving node appends its receipt just after the task, off the requester's path.
		within(t, 10*time.Second, fmt.Sprintf("node %d's log holding %s at %v", idx, r.rc.Result, r.rc.Time), func() bool {
			found := false
			err := receipts.Read(filepath.Join(tn.DataDir(idx), receipts.File), func(l receipts.Receipt, err error) bool {
				if err == nil && l.Result == r.rc.Result && l.Time.Equal(r.rc.Time) && l.Requester == r.rc.Requester {
					found = true
				}
				return !found
			})
			return err == nil && found
		})
	}
	t.Logf("coordinator %d: %d tasks metered; the liar served %d (metered as zero); by route %v", idx, requests, lies, served)
	return lies
}
