package main

import (
	"strings"
	"testing"

	"github.com/meshinfer/meshinfer/node/console"
)

// meshinfer status says the pipelines a node heads and the stage sessions it runs in
// words: each stage's node, layers and time per step, the hops, the steps; without the
// stages' times it says what the head measured alone.
func TestStatusSaysPipelines(t *testing.T) {
	ms := func(x float64) *float64 { return &x }
	a, b := "12D3KooWAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1a2b3c", "12D3KooWBbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbd4e5f6"
	var st console.Status
	st.Pipelines = console.Pipelines{Headed: 3, StageSessions: 1,
		Recent: []console.HeadedPipeline{
			{Model: "synth-large", Open: true, Steps: 35, StepMS: 23.46, HopsMS: ms(0.3), Stages: []console.PipelineStage{
				{Peer: a, Lo: 0, Hi: 8, ForwardMS: ms(12.04)}, {Peer: b, Lo: 8, Hi: 16, ForwardMS: ms(11.12)},
			}},
			{Model: "synth-large", Steps: 12, StepMS: 140.2, Failure: "peer_lost", Stages: []console.PipelineStage{
				{Peer: a, Lo: 0, Hi: 5}, {Peer: b, Lo: 5, Hi: 16},
			}},
			{Model: "synth-small", Stages: []console.PipelineStage{{Peer: b, Lo: 0, Hi: 4}}},
		},
		Sessions: []console.StageSession{{Model: "synth-base", Lo: 2, Hi: 6, Head: a, Index: 1, Stages: 3, Steps: 9, ForwardMS: 4.5}},
	}
	var out strings.Builder
	renderStatus(&out, st, nil)
	for _, s := range []string{
		"pipeline  headed 3 (0 failed to set up); running 1 stage sessions for heads now, 0 refused\n",
		"          synth-large: node 12D3KooW…1a2b3c layers 0-7 (12.0 ms/step) -> node 12D3KooW…d4e5f6 layers 8-15 (11.1 ms/step), " +
			"3 hops 0.30 ms/step, 35 steps of 23.5 ms, running\n",
		"          synth-large: node 12D3KooW…1a2b3c layers 0-4 -> node 12D3KooW…d4e5f6 layers 5-15, 12 steps of 140 ms, failed: peer_lost\n",
		"          synth-small: node 12D3KooW…d4e5f6 layers 0-3, 0 steps, ended\n",
		"          stage 2 of 3 for 12D3KooW…1a2b3c: synth-base layers 2-5, 9 steps of 4.50 ms\n",
	} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("status does not say %q:\n%s", s, out.String())
		}
	}
}

// meshinfer status says what the viability gate decided for cut streams.
func TestStatusSaysMigrations(t *testing.T) {
	var st console.Status
	st.Migration = console.Migration{
		Decisions: map[string]uint64{"replay": 3, "restart_cloud": 1, "restart_peer": 0, "live_transfer": 0, "none": 0},
		Recent: []console.MigrationDecision{
			{Model: "synth-tiny", Choice: "restart_cloud", Inputs: console.GateInputs{Generated: 4},
				OptionsMS: map[string]float64{"replay": 5957, "restart_cloud": 210}, EstimateMS: 210, TookMS: 180.4, Outcome: "completed"},
			{Model: "synth-tiny", Choice: "replay", Inputs: console.GateInputs{Generated: 9},
				OptionsMS: map[string]float64{"replay": 3957.2}, EstimateMS: 3957.2, Outcome: "running"},
		},
	}
	var out strings.Builder
	renderStatus(&out, st, nil)
	for _, s := range []string{
		"migration 4 cut streams: 3 replayed, 0 restarted on a peer, 1 restarted in the cloud, 0 moved live, 0 could not go on; the last 2:\n",
		"          synth-tiny: restart_cloud after 4 tokens (estimated 210 ms), completed in 180 ms\n",
		"          synth-tiny: replay after 9 tokens (estimated 4.0 s), running\n",
	} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("status does not say %q:\n%s", s, out.String())
		}
	}
}
