// Package localonly serves local-only requests: it is the privacy gate's whole code path. A
// request whose privacy is inference.PrivacyLocalOnly is handed to a Gate, which runs it on
// this device's backend or refuses it with local_unavailable. There is no fallback: nothing
// here can reach a peer or the cloud, because nothing here holds a network handle.
//
// # Rules
//
//   - No backend: local_unavailable.
//   - The model must be one the backend lists; otherwise local_unavailable naming the local
//     models. With route auto, a request naming no model, "auto" or a model not served
//     here gets the first warm local model, else the first local model.
//   - A failure of the backend before the first token that says the backend cannot serve
//     now (unavailable, model_not_found, overloaded, timeout not caused by the caller's
//     context, policy_paused, and any code that would name the network) becomes
//     local_unavailable, wrapping the backend's message.
//   - A failure that is the request's (invalid_request, context_overflow), the node's
//     (shutting_down), already local_unavailable, or the caller's context ending passes
//     through unchanged; so does any error after the first token: the tokens sent stand and
//     the client needs the real cause.
//
// # Imports
//
// Standard library and package inference only: no libp2p, no mesh, no transport, no node.
// testnet/deps_test.go checks that the local-only path (this package, inference,
// inference/synth and transport/openai) depends on no network stack of the mesh.
package localonly

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/meshinfer/meshinfer/inference"
)

// Gate runs local-only requests on one local backend. It is safe for concurrent use and
// starts no goroutines.
type Gate struct {
	b inference.Backend // nil: this node runs no local backend

	served, refused, failed atomic.Uint64
}

// Stats counts the outcomes of the requests a Gate has handled.
type Stats struct {
	// Served counts requests that ended with a finish reason.
	Served uint64 `json:"served"`
	// Refused counts requests that ended with local_unavailable.
	Refused uint64 `json:"refused"`
	// Failed counts requests that ended with any other error (the request's own, the
	// caller's cancellation, a failure after the first token).
	Failed uint64 `json:"failed"`
}

// New returns a Gate over b. b may be nil: every request is then refused with
// local_unavailable.
func New(b inference.Backend) *Gate {
	return &Gate{b: b}
}

// Stats returns the counters so far.
func (g *Gate) Stats() Stats {
	return Stats{Served: g.served.Load(), Refused: g.refused.Load(), Failed: g.failed.Load()}
}

// Generate serves req on the local backend, following the package's rules. It has the
// contract of inference.Backend.Generate: exactly one return, emit called synchronously with
// contiguous tokens and never after the return, emit's error returned unchanged. req is not
// modified; when the Gate picks the model it runs a copy.
func (g *Gate) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	res, err := g.generate(ctx, req, emit)
	switch {
	case err == nil:
		g.served.Add(1)
	case inference.CodeOf(err) == inference.CodeLocalUnavailable:
		g.refused.Add(1)
	default:
		g.failed.Add(1)
	}
	return res, err
}

func (g *Gate) generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	if g.b == nil {
		return inference.Result{}, inference.Errorf(inference.CodeLocalUnavailable,
			"this node runs no local backend; a local-only request cannot be served here")
	}
	model, err := g.pick(ctx, req)
	if err != nil {
		return inference.Result{}, err
	}
	run := req
	if model != req.Model {
		r := *req
		r.Model = model
		run = &r
	}
	// The backend calls emit on this goroutine only (its contract), so a plain bool will do.
	started := false
	res, err := g.b.Generate(ctx, run, func(t inference.Token) error {
		started = true
		return emit(t)
	})
	if err == nil || started {
		return res, err
	}
	return inference.Result{}, refusal(ctx, err)
}

// pick returns the model to run: the request's when the backend serves it; else, with route
// auto, the first warm local model, else the first local one (auto may change the model, and
// this device is the only tier a local-only request has).
func (g *Gate) pick(ctx context.Context, req *inference.Request) (string, error) {
	infos, err := g.b.Models(ctx)
	if err != nil {
		return "", refusal(ctx, err)
	}
	names := make([]string, 0, len(infos))
	for _, m := range infos {
		if m.Name == req.Model {
			return m.Name, nil
		}
		names = append(names, m.Name)
	}
	if req.Prefs.Route == inference.RouteAuto {
		for _, m := range infos {
			if m.Warm {
				return m.Name, nil
			}
		}
		if len(infos) > 0 {
			return infos[0].Name, nil
		}
		return "", inference.Errorf(inference.CodeLocalUnavailable,
			"the local backend serves no model; a local-only request is never sent elsewhere")
	}
	local := "none"
	if len(names) > 0 {
		local = strings.Join(names, ", ")
	}
	return "", inference.Errorf(inference.CodeLocalUnavailable,
		"model %q is not served on this device (local models: %s); a local-only request is never sent elsewhere",
		req.Model, local)
}

// refusal maps a failure before the first token: one that says the backend cannot serve now
// becomes local_unavailable; the request's own errors, the node's shutdown and the caller's
// context ending pass through.
func refusal(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err // the caller's cancellation or deadline, whatever the backend made of it
	}
	switch inference.CodeOf(err) {
	case inference.CodeInvalidRequest, inference.CodeContextOverflow,
		inference.CodeShuttingDown, inference.CodeLocalUnavailable:
		return err
	}
	return inference.Errorf(inference.CodeLocalUnavailable, "local backend cannot serve it: %w", err)
}
