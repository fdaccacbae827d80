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
)

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
