package node

import (
	"context"
	"errors"
	"slices"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/reputation"
	"github.com/meshinfer/meshinfer/transport/infer"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// dispatcher serves API requests: it asks mesh/route for the targets to try, runs each on the
// local backend or through the peer protocol, records every outcome in the reputation store,
// and moves to the next target when one fails before streaming anything. A failure after
// tokens have streamed ends the request with that typed error (resuming a cut stream on
// another peer comes with the router).
type dispatcher struct {
	n      *Node
	client *infer.Client
}

// Models lists this node's models and every model announced by a fresh peer.
func (d dispatcher) Models(ctx context.Context) []openai.Model {
	byID := map[string]*openai.Model{}
	var order []string
	add := func(id, where string, warm bool) {
		m, ok := byID[id]
		if !ok {
			m = &openai.Model{ID: id}
			byID[id] = m
			order = append(order, id)
		}
		m.Routes = append(m.Routes, where)
		m.Warm = m.Warm || warm
	}
	if d.n.backend != nil {
		if local, err := d.n.backend.Models(ctx); err == nil {
			for _, m := range local {
				add(m.Name, route.Target{Local: true}.String(), m.Warm)
			}
		}
	}
	for _, e := range d.n.reg.Entries(d.n.cfg.Now()) {
		if e.Stale || e.Vector == nil {
			continue
		}
		for _, m := range e.Vector.Models {
			add(m.Name, route.Target{Peer: e.Peer}.String(), m.State == caps.ModelWarm)
		}
	}
	slices.Sort(order)
	out := make([]openai.Model, 0, len(order))
	for _, id := range order {
		out = append(out, *byID[id])
	}
	return out
}

// Generate serves req on the first target of the plan that does not fail before streaming.
func (d dispatcher) Generate(ctx context.Context, req *inference.Request, emit func(string, inference.Token) error) (inference.Result, string, error) {
	now := d.n.cfg.Now()
	plan := route.Plan(req.Model, d.n.cfg.Models, d.n.reg.Entries(now), d.n.rep, now)
	if len(plan) == 0 {
		return inference.Result{}, "", inference.Errorf(inference.CodeModelNotFound,
			"no node in mesh %q serves model %q; GET /v1/models lists what is available", d.n.cfg.Mesh, req.Model)
	}
	var (
		res      inference.Result
		err      error
		lastPath string
	)
	for _, t := range plan {
		where := t.String()
		lastPath = where
		sent := 0
		var emitErr error
		forward := func(tok inference.Token) error {
			if emitErr = emit(where, tok); emitErr == nil {
				sent++
			}
			return emitErr
		}
		if t.Local {
			res, err = d.n.backend.Generate(ctx, req, forward)
		} else {
			res, err = d.client.Generate(ctx, t.Peer, req, forward)
		}
		d.record(t, req.Model, err, emitErr != nil)
		if err == nil || emitErr != nil || ctx.Err() != nil || sent > 0 || !inference.CodeOf(err).Retryable() {
			return res, where, err
		}
		log.Debugw("target failed before streaming; trying the next", "target", where, "model", req.Model, "err", err)
	}
	return inference.Result{}, lastPath, err
}

// record turns one attempt's outcome into a reputation event.
func (d dispatcher) record(t route.Target, model string, err error, clientGone bool) {
	var o reputation.Outcome
	switch code := inference.CodeOf(err); {
	case err == nil:
		o = reputation.Success
	case clientGone || errors.Is(err, context.Canceled):
		o = reputation.ClientDisconnected
	case code == inference.CodeTimeout:
		o = reputation.Timeout
	case code == inference.CodeUnavailable, code == inference.CodePeerLost, code == inference.CodeModelNotFound:
		o = reputation.Unavailable
	case code == inference.CodeContextOverflow:
		o = reputation.ContextOverflow
	case code == inference.CodeOverloaded, code == inference.CodePolicyPaused, code == inference.CodeShuttingDown:
		o = reputation.Rejected
	default:
		return // invalid_request and the like say nothing about the target
	}
	d.n.rep.Record(reputation.Target{Model: model, Peer: t.RepKey()}, o, d.n.cfg.Now())
}
