package dispatch

import (
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/reputation"
)

// quorumDigests are the outputs a plan of FuzzVerifierQuorum may return: the first is the
// request's true output, what every honest plan returns (verified models are deterministic
// everywhere: "Which tasks"); the others are lies, which colluding liars may share.
var quorumDigests = [4]inference.Digest{
	inference.DigestOf([]inference.Token{{Index: 0, Text: "mesh", ID: 7}}),
	inference.DigestOf([]inference.Token{{Index: 0, Text: "mesh", ID: 8}}),
	inference.DigestOf([]inference.Token{{Index: 0, Text: "node", ID: 7}}),
	inference.DigestOf([]inference.Token{{Index: 0, Text: "mesh!", ID: 7}}),
}

// FuzzVerifierQuorum is Z11 of docs/reliability.md: the vote of a verification, from the
// digests of the plans run to who the reputation store penalizes. The input gives two or
// three plans (the served one, the second, and a third when a vetted one exists), each one
// peer or a pipeline of one to three stages, disjoint as pickVerifier makes them, each
// returning the true output or one of three lies; byte 0's low 5 bits add passed
// verifications to every peer beforehand, so scores start anywhere from 50 up to the cap.
// The vote runs as verify runs it: inference.Judge over the first two digests, then, not
// settled and a third plan there, over all three; settled, settle records the verdict in a
// real store. The executions themselves (replay) are the testnet's, not this target's.
//
// Asserted, from the peers' scores before and after: a plan whose output another plan
// shares is never the odd one and its peers never lose score, so an honest majority (two
// honest plans of three) is never penalized; the odd plan is the one apart from two that
// agree, and loses score exactly when it is one peer (a pipeline's stages are isolated
// next, isolate.go, and lose nothing here); two plans that disagree with no third, or
// three different outputs, are inconclusive: no peer's score moves, neither penalty nor
// credit. The catalogue's "cross-class disagreement" is that case: this node verifies only
// models that are deterministic on every node, so a disagreement between honest
// executions of different hardware classes cannot arise, and any two-way disagreement is
// left to a third plan or to nobody.
func FuzzVerifierQuorum(f *testing.F) {
	f.Add([]byte{0, 0x00, 0x00})                      // two single peers agree
	f.Add([]byte{0, 0x00, 0x01})                      // two disagree, no third: inconclusive
	f.Add([]byte{0x80 | 4, 0x01, 0x00, 0x00})         // the served peer lied
	f.Add([]byte{0x80 | 4, 0x00, 0x02, 0x00})         // the verifier lied
	f.Add([]byte{0x80, 0x01, 0x02, 0x03})             // three different outputs
	f.Add([]byte{0x80 | 31, 0x0d, 0x00, 0x04})        // a pipeline of three stages lied
	f.Add([]byte{0x80 | 2, 0x01, 0x09, 0x05})         // two liars agree against an honest plan
	f.Add([]byte{0x80 | 10, 0x04 | 0x02, 0x00, 0x0c}) // a one-stage pipeline lied
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 3 {
			return
		}
		n := 2
		if data[0]&0x80 != 0 && len(data) >= 4 {
			n = 3
		}
		rep, err := reputation.New(reputation.DefaultParams())
		if err != nil {
			t.Fatal(err)
		}
		at := time.UnixMilli(1_800_000_000_000)
		d := &Executor{cfg: Config{Rep: rep, Now: func() time.Time { return at }}}

		ran := make([]route.Target, n)
		sums := make([]inference.Digest, n)
		next := 0 // peers are numbered across plans: the plans are disjoint
		for i := range n {
			ran[i], next = quorumPlan(data[1+i], next)
			sums[i] = quorumDigests[data[1+i]&3]
		}
		for k := range next {
			for range data[0] & 31 {
				rep.Observe(quorumPeer(k), reputation.VerificationPassed, at.Add(-time.Minute))
			}
		}
		before := make([]float64, next)
		for k := range before {
			before[k] = rep.Score(quorumPeer(k), at)
		}

		// The vote, as verify runs it.
		odd, settled, voters := -1, false, 0
		for voters = 2; voters <= n; voters++ {
			if odd, settled = inference.Judge(sums[:voters]); settled {
				d.settle("m", ran[:voters], odd)
				break
			}
		}
		voters = min(voters, n)

		// What it should have been: the output shared by two plans run, if any.
		majority := -1
		for i := range voters {
			if quorumCount(sums[:voters], sums[i]) >= 2 {
				majority = i
				break
			}
		}
		if settled != (majority >= 0) {
			t.Fatalf("digests %v: settled %v, but a majority output exists: %v", digestNames(sums[:voters]), settled, majority >= 0)
		}
		if settled && odd >= 0 && sums[odd] == sums[majority] {
			t.Fatalf("digests %v: plan %d judged odd although it agrees with the majority", digestNames(sums[:voters]), odd)
		}
		if settled && odd < 0 && quorumCount(sums[:voters], sums[0]) != voters {
			t.Fatalf("digests %v: nobody odd although the outputs differ", digestNames(sums[:voters]))
		}

		for i, tg := range ran {
			keys := planKeys(tg)
			for _, key := range keys {
				k, ok := quorumIndex[key]
				if !ok {
					t.Fatalf("plan %d has key %q, not one of the fuzzed peers", i, key)
				}
				after := rep.Score(key, at)
				switch {
				case !settled || i >= voters:
					if after != before[k] {
						t.Fatalf("digests %v (inconclusive): plan %d's peer %s moved from %.2f to %.2f",
							digestNames(sums[:voters]), i, key, before[k], after)
					}
				case i != odd:
					if after < before[k] {
						t.Fatalf("digests %v: plan %d agrees with the majority and its peer %s fell from %.2f to %.2f",
							digestNames(sums[:voters]), i, key, before[k], after)
					}
				case len(keys) == 1:
					if !(after < before[k]) {
						t.Fatalf("digests %v: plan %d, one peer, is odd and its score stayed at %.2f",
							digestNames(sums[:voters]), i, after)
					}
				default:
					if after != before[k] {
						t.Fatalf("digests %v: stage %s of odd pipeline %d moved from %.2f to %.2f before its isolation",
							digestNames(sums[:voters]), key, i, before[k], after)
					}
				}
			}
			honest := sums[i] == quorumDigests[0]
			if honest && quorumCount(sums, quorumDigests[0]) >= 2 && settled && i == odd {
				t.Fatalf("digests %v: honest plan %d penalized by an honest majority", digestNames(sums[:voters]), i)
			}
		}
	})
}

// quorumPlan decodes one plan of FuzzVerifierQuorum from b, its peers numbered from next:
// bits 2-3 are its stages (0: one peer holding the model whole; 1-3: a pipeline of that
// many stages, this node heading), bit 4 makes a pipeline's last stage a second range of its
// first stage's peer. It returns the plan and the next free peer number.
func quorumPlan(b byte, next int) (route.Target, int) {
	stages := int(b>>2) & 3
	if stages == 0 {
		return route.Target{Tier: route.TierMesh, Model: "m", Peer: quorumPeerID(next)}, next + 1
	}
	t := route.Target{Tier: route.TierMesh, Model: "m"}
	for s := range stages {
		p := quorumPeer(next)
		if s == stages-1 && s > 0 && b&0x10 != 0 {
			p = t.Stages[0].Peer // a pipeline may give one peer two ranges
		} else {
			next++
		}
		t.Stages = append(t.Stages, inference.StageHop{Peer: p, Lo: s, Hi: s + 1})
	}
	return t, next
}

// quorumPeers is the most peers FuzzVerifierQuorum's plans hold: three plans of three stages.
const quorumPeers = 9

// quorumPeerID is the k-th peer of FuzzVerifierQuorum; quorumPeer its reputation key (the
// peer ID's string form, as a pipeline's stage and Target.RepKey name it).
func quorumPeerID(k int) peer.ID { return peer.ID(fmt.Sprintf("quorum-peer-%d", k)) }
func quorumPeer(k int) string    { return quorumPeerID(k).String() }

// quorumIndex maps each peer's key back to its number.
var quorumIndex = func() map[string]int {
	m := make(map[string]int, quorumPeers)
	for k := range quorumPeers {
		m[quorumPeer(k)] = k
	}
	return m
}()

// quorumCount is how many of sums equal s.
func quorumCount(sums []inference.Digest, s inference.Digest) int {
	n := 0
	for _, x := range sums {
		if x == s {
			n++
		}
	}
	return n
}

// digestNames names each of sums by its index in quorumDigests: 0 the true output.
func digestNames(sums []inference.Digest) []int {
	out := make([]int, len(sums))
	for i, s := range sums {
		out[i] = -1
		for j, q := range quorumDigests {
			if s == q {
				out[i] = j
			}
		}
	}
	return out
}
