package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/testnet"
)

// Scenarios of `meshinfer testnet --scenario`.
const (
	scenarioNone         = "none"
	scenarioBatteryDrain = "battery-drain"
	scenarioShard        = "shard"
)

// shardModel is the model of the shard scenario: larger than a testnet node's budget.
const shardModel = "synth-large"

// shardModels is what a node of the shard scenario serves: its usual model, and every node
// but the router also announces synth-large, which none holds whole.
func shardModels(i int) []string {
	ms := testnet.DefaultModels(i)
	if i > 0 {
		ms = append(ms, shardModel)
	}
	return ms
}

// shard asks node 0 for synth-large, which no node's memory budget holds: the router plans
// a pipeline of layer ranges over the nodes that announce it, and the answer streams from
// the chain. It prints the plan (which node holds which layers), the speed, and the text.
func shard(ctx context.Context, w io.Writer, tn *testnet.Testnet) {
	router := tn.Node(0)
	if router == nil || tn.Len() < 3 {
		fmt.Fprintln(w, "shard needs at least 3 nodes")
		return
	}
	names := map[string]string{}
	for i := range tn.Len() {
		if n := tn.Node(i); n != nil {
			names[n.ID().String()] = fmt.Sprintf("node %d", i)
		}
	}
	fmt.Fprintf(w, "\nscenario shard: %s (481 MB of weights, 16 layers) is larger than any node's %d MiB budget;\n"+
		"node 0 plans it as a pipeline of layer ranges over the nodes that announce it (the first request loads each stage's layers)\n",
		shardModel, testnet.DefaultMemoryBudget>>20)
	for i, prompt := range []string{"tell me about meshes", "and about pipelines"} {
		began := time.Now()
		var text strings.Builder
		rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		out, err := chat(rctx, "http://"+router.APIAddr(), chatRequest{model: shardModel, prompt: prompt, maxTokens: 12},
			func(s string) { text.WriteString(s) })
		cancel()
		if err != nil {
			fmt.Fprintf(w, "  request %d refused: %v\n", i+1, err)
			return
		}
		served, _ := inference.ParseRoute(out.route)
		var plan []string
		for _, st := range served.Stages {
			who := names[st.Peer]
			if who == "" {
				who = st.Peer
			}
			plan = append(plan, fmt.Sprintf("%s layers %d-%d", who, st.Lo, st.Hi-1))
		}
		if len(plan) == 0 {
			plan = []string{out.route}
		}
		fmt.Fprintf(w, "  request %d: %d tokens in %v through %s: %q\n", i+1, out.tokens,
			time.Since(began).Round(time.Millisecond), strings.Join(plan, " -> "), text.String())
	}
	fmt.Fprintln(w, "  (the second request finds every stage's layers loaded: its time is the pipeline's own)")
	if recent := router.Status().Pipelines.Recent; len(recent) > 0 {
		fmt.Fprintf(w, "  node 0's status says: %s\n", headedWords(recent[0]))
	}
}

// batteryDrain drains node 1's simulated battery (5 points a step) to below the
// participation floor, holds it there, then plugs it in. Each step it prints the battery,
// the node's own admission state, whether node 0 sees it accepting, and who served one
// request for node 1's model sent to node 0: the node pausing, being skipped, and coming
// back after its recovery heartbeats.
func batteryDrain(ctx context.Context, w io.Writer, tn *testnet.Testnet, step time.Duration) {
	const drained = 1
	n, router, s := tn.Node(drained), tn.Node(0), tn.Sensors(drained)
	if n == nil || router == nil || s == nil || tn.Len() < 3 {
		fmt.Fprintln(w, "battery-drain needs at least 3 nodes")
		return
	}
	model := "synth-small"
	if ms := n.Status().Inference.Models; len(ms) > 0 {
		model = ms[0]
	}
	names := map[string]string{"local": "node 0 itself", "cloud": "the cloud"}
	for i := range tn.Len() {
		if nd := tn.Node(i); nd != nil {
			names[inference.Served{Tier: inference.TierMesh, Peer: nd.ID().String()}.Route()] = fmt.Sprintf("node %d", i)
		}
	}
	fmt.Fprintf(w, "\nscenario battery-drain: node 1's battery drains below the %d%% floor, then charges; "+
		"each step node 0 is asked for %s (served by node 1 or another node that has it)\n", participation.DefaultBatteryFloor, model)
	st := s.State()
	phase := "draining"
	for stepN := 0; ; stepN++ {
		switch {
		case phase == "draining" && st.BatteryLevel <= participation.DefaultBatteryFloor-10:
			phase = "holding"
		case phase == "holding" && stepN%4 == 0:
			phase, st.Charging = "charging", true
		case phase == "charging" && n.Status().Participation.Admission == "accepting" && seenAccepting(router, n):
			phase = "done"
		}
		switch phase {
		case "draining":
			st.BatteryLevel -= 5
		case "charging":
			st.BatteryLevel = min(st.BatteryLevel+10, 100)
		}
		if err := s.Set(st); err != nil {
			fmt.Fprintf(w, "set sensors: %v\n", err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(step):
		}
		p := n.Status().Participation
		state := p.Admission
		if len(p.Reasons) > 0 {
			state += " (" + strings.Join(p.Reasons, ", ") + ")"
		}
		served := "-"
		if out, err := chat(ctx, "http://"+router.APIAddr(), chatRequest{model: model, prompt: "hello", maxTokens: 4},
			func(string) {}); err != nil {
			served = "error: " + err.Error()
		} else if name, ok := names[out.route]; ok {
			served = name
		} else {
			served = out.route
		}
		fmt.Fprintf(w, "  battery %3d%% %-11s node 1: %-28s node 0 sees it %-13s request served by %s\n",
			st.BatteryLevel, cond(st.Charging, "charging", "on battery"), state,
			cond(seenAccepting(router, n), "accepting", "not accepting"), served)
		if phase == "done" {
			fmt.Fprintln(w, "node 1 is back.")
			return
		}
	}
}

// seenAccepting reports whether observer holds a fresh vector of n that says it accepts work.
func seenAccepting(observer, n *node.Node) bool {
	e, ok := observer.Registry().Get(n.ID(), time.Now())
	return ok && !e.Stale && e.Vector != nil && e.Vector.Load.Accepting
}
