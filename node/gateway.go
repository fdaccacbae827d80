package node

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// startGateway opens the coordinator's key store and usage meter in the data dir and returns
// what wraps its API: every request needs a live API key (401 otherwise), GET /v1/usage
// answers the calling key's usage, and GET /v1/gateway is the WebSocket endpoint of thin
// clients (transport/gateway/client), which runs each request through the same API handler,
// so metering and the privacy gate apply as over REST.
func (n *Node) startGateway() (func(http.Handler) http.Handler, error) {
	var err error
	if n.keys, err = gateway.OpenKeys(n.cfg.DataDir); err != nil {
		return nil, fmt.Errorf("coordinator API keys: %w", err)
	}
	if n.meter, err = gateway.OpenMeter(n.cfg.DataDir); err != nil {
		return nil, fmt.Errorf("coordinator usage meter: %w", err)
	}
	n.closers = append(n.closers, n.meter.Close)
	n.tasks = taskMeter{m: n.meter, now: n.cfg.Now}
	if len(n.keys.List()) == 0 {
		log.Warnw("coordinator has no API keys yet: every request is refused until one is created",
			"create", "meshinfer keys create --name NAME --data-dir "+n.cfg.DataDir)
	}
	usage := gateway.UsageHandler(n.meter)
	// api is the OpenAI handler, set when openai.New wraps it, before it serves anything.
	var api http.Handler
	ws, err := gateway.NewWebSocket(n.keys, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api.ServeHTTP(w, r)
	}))
	if err != nil {
		return nil, fmt.Errorf("coordinator gateway: %w", err)
	}
	// Closed after the API server (appended before it), before the meter its runs record in.
	n.closers = append(n.closers, ws.Close)
	return func(h http.Handler) http.Handler {
		api = h
		mux := http.NewServeMux()
		mux.Handle("/v1/usage", usage)
		mux.Handle(gateway.WebSocketPath, ws)
		mux.Handle("/", h)
		return gateway.RequireKey(n.keys, mux)
	}, nil
}

// taskMeter meters the finished API requests of a coordinator's clients. It holds the meter
// and a clock, no network handle: it also wraps the local-only path.
type taskMeter struct {
	m   *gateway.Meter // nil: not a coordinator, nothing is metered
	now func() time.Time
}

// record records one finished request: its key (from the session RequireKey put in ctx),
// model, where it was served, tokens and time. No session: nothing.
func (tm taskMeter) record(ctx context.Context, model string, at openai.Served, res inference.Result, err error, took time.Duration) {
	if tm.m == nil {
		return
	}
	s, ok := gateway.SessionFrom(ctx)
	if !ok {
		return
	}
	outcome := gateway.OutcomeCompleted
	if err != nil {
		outcome = string(inference.CodeOf(err))
	}
	if merr := tm.m.Record(gateway.MeterEvent{
		Time: tm.now(), KeyID: s.KeyID, Model: model, Peer: at.Route,
		TokensIn: res.Usage.PromptTokens, TokensOut: res.Usage.CompletionTokens,
		DurationMS: took.Milliseconds(), Outcome: outcome,
	}); merr != nil {
		log.Errorw("usage not metered", "key", s.KeyID, "err", merr)
	}
}

// meteredLocal meters the local-only requests a coordinator's clients send.
type meteredLocal struct {
	g  openai.Local
	tm taskMeter
}

func (m meteredLocal) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	start := time.Now()
	res, err := m.g.Generate(ctx, req, emit)
	m.tm.record(ctx, req.Model, openai.Served{Route: "local", Attempts: 1}, res, err, time.Since(start))
	return res, err
}
