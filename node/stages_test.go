package node

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/mesh/receipts"
)

// A pipeline this node heads ends, once closed in order, with each stage's receipt of its
// part countersigned by this node: every pair verifies with mesh/receipts for the head,
// signed by that stage for its layers, the model and the steps and positions the session
// ran, all of one session; /api/status lists them with the pipeline; and each stage's own
// log has the session's line with the same time and stage member.
func TestPipelineEndsWithCountersignedStageReceipts(t *testing.T) {
	const model = "synth-small"
	head := startTestNode(t, Config{})
	var stages []*Node
	var dirs []string
	for range 3 {
		dir := t.TempDir()
		n := startTestNode(t, Config{Models: []string{model}, DataDir: dir, Consent: &participation.Consent{
			Version: participation.ConsentVersion, Contribute: true, BatteryFloor: participation.DefaultBatteryFloor}})
		if err := head.Host().Connect(context.Background(), n.AddrInfo()); err != nil {
			t.Fatal(err)
		}
		stages, dirs = append(stages, n), append(dirs, dir)
	}
	hops := []inference.StageHop{
		{Peer: stages[0].ID().String(), Lo: 0, Hi: 1},
		{Peer: stages[1].ID().String(), Lo: 1, Hi: 2},
		{Peer: stages[2].ID().String(), Lo: 2, Hi: 4},
	}
	req := &inference.Request{Model: model, Messages: []inference.Message{{Role: inference.RoleUser, Content: "receipts, please"}},
		MaxTokens: new(6)}
	maxPos := req.PromptTokensBound() + req.EffectiveMaxTokens()
	layers, closeChain, err := head.OpenPipeline(t.Context(), model, hops, maxPos, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := head.head.GenerateWith(t.Context(), req, layers, func(inference.Token) error { return nil })
	if err != nil {
		closeChain()
		t.Fatal(err)
	}
	got := closeChain()
	if len(got) != len(hops) {
		t.Fatalf("%d countersigned stage receipts, want %d", len(got), len(hops))
	}
	recent := head.Status().Pipelines.Recent
	if len(recent) != 1 || recent[0].Open || len(recent[0].Stages) != len(hops) || recent[0].Steps < 2 {
		t.Fatalf("status lists %+v, want the one pipeline, ended after its steps", recent)
	}
	var session string
	var parts []receipts.Receipt
	for i, sr := range got {
		r, err := receipts.VerifyStageCountersig(head.ID().String(), sr.Receipt, sr.Countersig)
		if err != nil {
			t.Fatalf("stage %d: %v", i, err)
		}
		h := hops[i]
		// Every stage ran every step: the prompt's positions at the first, one at each
		// after it.
		steps, positions := recent[0].Steps, res.Usage.PromptTokens+recent[0].Steps-1
		if r.Server != h.Peer || r.Model != model || r.Outcome != receipts.Completed || r.Stage.Lo != h.Lo || r.Stage.Hi != h.Hi ||
			r.Stage.Steps != steps || r.Stage.Positions != positions {
			t.Fatalf("stage %d's receipt %+v (stage %+v): want %s, layers [%d, %d), %d steps over %d positions",
				i, r, r.Stage, h.Peer, h.Lo, h.Hi, steps, positions)
		}
		if i == 0 {
			session = r.Stage.Session
		}
		if r.Stage.Session == "" || r.Stage.Session != session {
			t.Fatalf("stage %d's receipt is of session %q, stage 0's of %q", i, r.Stage.Session, session)
		}
		if s := recent[0].Stages[i]; s.Receipt != sr.Receipt || s.Countersig != sr.Countersig {
			t.Fatalf("status lists stage %d's receipt %q, %q; the close gave %+v", i, s.Receipt, s.Countersig, sr)
		}
		parts = append(parts, r)
	}

	// Each stage's log gets the session's line from its receipt queue, within its batch
	// window (a second).
	for i, dir := range dirs {
		want := parts[i]
		within(t, 10*time.Second, "stage's log holds the session's line", func() bool {
			var lines []receipts.Receipt
			receipts.Read(filepath.Join(dir, receipts.File), func(r receipts.Receipt, err error) bool {
				if err == nil {
					lines = append(lines, r)
				}
				return true
			})
			return slices.ContainsFunc(lines, func(r receipts.Receipt) bool {
				return r.Stage != nil && *r.Stage == *want.Stage && r.Time.Equal(want.Time) &&
					r.DurationMS == want.DurationMS && r.Requester == head.ID().String()
			})
		})
	}
}
