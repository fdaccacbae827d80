// Package route decides where a request for a model is tried, and in what order.
//
// The rule today (the data-plane rule; the router with tiers, a privacy gate and
// speculative dispatch replaces it): this node first when it serves the model, then the
// peers whose latest verified capability vector announces the model and says they accept
// work, minus peers the reputation store excludes (score < 40), in the store's order
// (cooling targets dropped while another remains, then by local penalty).
//
// Plan is a pure function of its inputs and now. It must not import transport or node.
package route

import (
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/reputation"
)

// Target is one place a request can be served.
type Target struct {
	Local bool    // this node's own backend
	Peer  peer.ID // set when !Local
}

// String is the route as the API reports it: "local" or "peer:<peer ID>".
func (t Target) String() string {
	if t.Local {
		return "local"
	}
	return "peer:" + t.Peer.String()
}

// RepKey is the target's key in the reputation store.
func (t Target) RepKey() string {
	if t.Local {
		return reputation.LocalTarget
	}
	return t.Peer.String()
}

// Plan returns the targets to try for model, in order. localModels are the models this node's
// backend serves; entries are the registry's peers.
func Plan(model string, localModels []string, entries []registry.Entry, rep *reputation.Store, now time.Time) []Target {
	var plan []Target
	if slices.Contains(localModels, model) {
		plan = append(plan, Target{Local: true})
	}
	var ids []string
	for _, e := range entries {
		if e.Stale || e.Vector == nil || !e.Vector.Load.Accepting || !announces(e, model) {
			continue
		}
		if rep != nil && rep.Excluded(e.Peer.String(), now) {
			continue
		}
		ids = append(ids, e.Peer.String())
	}
	if rep != nil {
		ids = rep.Order(model, ids, reputation.Explicit, now)
	}
	for _, id := range ids {
		p, err := peer.Decode(id)
		if err != nil {
			continue
		}
		plan = append(plan, Target{Peer: p})
	}
	return plan
}

func announces(e registry.Entry, model string) bool {
	return slices.ContainsFunc(e.Vector.Models, func(m caps.Model) bool { return m.Name == model })
}
