package main

import (
	"context"
	"fmt"
	"io"
	"slices"
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
	for route, i := range nodeRoutes(tn) {
		names[route] = fmt.Sprintf("node %d", i)
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
			handover(ctx, w, tn, step, handoverTokens)
			return
		}
	}
}

// seenAccepting reports whether observer holds a fresh vector of n that says it accepts work.
func seenAccepting(observer, n *node.Node) bool {
	e, ok := observer.Registry().Get(n.ID(), time.Now())
	return ok && !e.Stale && e.Vector != nil && e.Vector.Load.Accepting
}

// handoverTokens is how long the answer of the handover act is: long enough to be still
// running when the node serving it pauses, a heartbeat or two after its battery drops.
const handoverTokens = 2000

// handover plays the battery-drain scenario's last act: node 0 streams an answer (tokens long) of a
// model two peers serve, and the battery of the peer serving it drops below the floor
// mid-stream. The peer pauses and hands its running generation over, as node 0's viability
// gate decides (live transfer of the KV cache on a fast link), and the stream goes on from
// another node. It prints where the stream began and ended, the gate's decision from node
// 0's status (what /api/status shows under "migration"), and whether the text is the same
// as an uninterrupted run's; then the peer charges again.
func handover(ctx context.Context, w io.Writer, tn *testnet.Testnet, heartbeat time.Duration, tokens int) {
	const model = "synth-small"
	router, index := tn.Node(0), nodeRoutes(tn)
	var serving []int
	for i := 1; i < tn.Len(); i++ {
		if n := tn.Node(i); n != nil && tn.Sensors(i) != nil && slices.Contains(n.Status().Inference.Models, model) {
			serving = append(serving, i)
		}
	}
	if router == nil || len(serving) < 2 {
		fmt.Fprintf(w, "\n(the live handover needs two nodes serving %s besides node 0: run 4 nodes or more)\n", model)
		return
	}
	fmt.Fprintf(w, "\nlive handover: node 0 streams a %d-token %s answer, and the battery of the node serving it drops mid-stream\n", tokens, model)
	cr := chatRequest{model: model, prompt: "tell me about meshes", maxTokens: tokens, seed: 17}
	started := make(chan string, 1)
	cr.onStart = func(route string) { started <- route }
	type result struct {
		out  chatOutcome
		text string
		err  error
	}
	done := make(chan result, 1)
	go func() { // ends with the stream: it completes, fails, or ctx ends
		var text strings.Builder
		out, err := chat(ctx, "http://"+router.APIAddr(), cr, func(s string) { text.WriteString(s) })
		done <- result{out, text.String(), err}
	}()
	var route string
	select {
	case route = <-started:
	case r := <-done:
		fmt.Fprintf(w, "  the stream did not start: %v\n", r.err)
		return
	case <-ctx.Done():
		<-done
		return
	}
	drained, ok := index[route]
	if !ok || drained == 0 || tn.Node(drained) == nil || tn.Sensors(drained) == nil {
		fmt.Fprintf(w, "  served by %s, not a peer: nothing to hand over\n", route)
		<-done
		return
	}
	// The router measures the serving peer's bandwidth as the attempt starts (the gate
	// weighs a transfer by it); the battery drops once it has, or after a few seconds.
	peer := tn.Node(drained)
	for wait := time.Now().Add(5 * time.Second); time.Now().Before(wait) && !measuredWith(router, peer); {
		select {
		case <-ctx.Done():
			<-done
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	s := tn.Sensors(drained)
	before := s.State()
	st := before
	st.BatteryLevel, st.Charging = participation.DefaultBatteryFloor-5, false
	if err := s.Set(st); err != nil {
		fmt.Fprintf(w, "  set sensors: %v\n", err)
		<-done
		return
	}
	fmt.Fprintf(w, "  node %d serves it; its battery drops to %d%%: it pauses within a heartbeat (%v) and hands the generation over\n",
		drained, st.BatteryLevel, heartbeat)
	r := <-done
	if err := s.Set(before); err != nil {
		fmt.Fprintf(w, "  set sensors: %v\n", err)
	}
	if r.err != nil {
		fmt.Fprintf(w, "  the stream failed: %v\n", r.err)
		return
	}
	if peer.Status().Inference.Moved == 0 && r.out.route == route {
		fmt.Fprintf(w, "  the answer ended (%d tokens) before node %d paused: nothing moved (a fast machine: try --heartbeat 500ms)\n", r.out.tokens, drained)
		return
	}
	if m := router.Status().Migration; len(m.Recent) > 0 {
		d := m.Recent[len(m.Recent)-1]
		fmt.Fprintf(w, "  node 0's gate chose %s (%s): %.1f MB of KV cache, link measured at %.0f Mbit/s, estimated %s, %s from the decision to the last token\n",
			d.Choice, d.Outcome, float64(d.Inputs.KVBytes)/1e6, d.Inputs.BandwidthMbps,
			msDuration(d.EstimateMS), msDuration(d.TookMS))
	}
	to := r.out.route
	if i, ok := index[to]; ok {
		to = fmt.Sprintf("node %d", i)
	}
	// An uninterrupted run of the same request, kept on one node (local-only), for the
	// comparison: the synthetic models are deterministic.
	ref := serving[0]
	if ref == drained {
		ref = serving[1]
	}
	refReq := cr
	refReq.onStart, refReq.privacy = nil, string(inference.PrivacyLocalOnly)
	var want strings.Builder
	if _, err := chat(ctx, "http://"+tn.Node(ref).APIAddr(), refReq, func(s string) { want.WriteString(s) }); err != nil {
		fmt.Fprintf(w, "  the stream went on from %s: %d tokens, finish %s (the uninterrupted run for comparison failed: %v)\n", to, r.out.tokens, r.out.finish, err)
		return
	}
	same := "identical to"
	if want.String() != r.text {
		same = "DIFFERENT from"
	}
	fmt.Fprintf(w, "  the stream went on from %s: %d tokens, finish %s, %s an uninterrupted run on node %d; node %d charges again\n",
		to, r.out.tokens, r.out.finish, same, ref, drained)
}

// nodeRoutes maps the route a request served by each of tn's nodes reports
// (X-Meshinfer-Route: peer:<id>) to the node's index.
func nodeRoutes(tn *testnet.Testnet) map[string]int {
	routes := map[string]int{}
	for i := range tn.Len() {
		if n := tn.Node(i); n != nil {
			routes[inference.Served{Tier: inference.TierMesh, Peer: n.ID().String()}.Route()] = i
		}
	}
	return routes
}

// measuredWith reports whether n has measured its bandwidth with p each way.
func measuredWith(n, p *node.Node) bool {
	for _, e := range n.Peers() {
		if e.PeerID == p.ID().String() {
			return e.BandwidthMbps != nil && e.BandwidthMbps.Down > 0 && e.BandwidthMbps.Up > 0
		}
	}
	return false
}

// msDuration prints a status figure in milliseconds as a duration.
func msDuration(ms float64) time.Duration {
	return time.Duration(ms * float64(time.Millisecond)).Round(time.Millisecond)
}
