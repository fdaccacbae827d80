package node

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/receipts"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/infer"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// startGateway opens the coordinator's key store in the data dir and returns
// what wraps its API: every request needs a live API key (401 otherwise), GET /v1/usage
// answers the calling key's usage, and GET /v1/gateway is the WebSocket endpoint of thin
// clients (transport/gateway/client), which runs each request through the same API handler,
// so metering and the privacy gate apply as over REST, and relays direct requests
// (direct.go). Browser pages on the --gateway-origin origins may call it too (CORS).
func (n *Node) startGateway() (func(http.Handler) http.Handler, error) {
	var err error
	if n.keys, err = gateway.OpenKeys(n.cfg.DataDir); err != nil {
		return nil, fmt.Errorf("coordinator API keys: %w", err)
	}
	if len(n.keys.List()) == 0 {
		log.Warnw("coordinator has no API keys yet: every request is refused until one is created",
			"create", "meshinfer keys create --name NAME --data-dir "+n.cfg.DataDir)
	}
	usage := gateway.UsageHandler(n.meter)
	// api is the OpenAI handler, set when openai.New wraps it, before it serves anything.
	var api http.Handler
	ws, err := gateway.NewWebSocket(n.keys, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api.ServeHTTP(w, r)
	}), gateway.WithDirect(n.exec.Relay), gateway.WithOriginPatterns(n.cfg.GatewayOrigins),
		// Completed results outlive a restart, and the meter tells which tasks ran: no
		// resubmission is billed twice (package gateway, "Across a restart").
		gateway.WithRecords(n.cfg.DataDir, n.meter), gateway.WithClock(n.cfg.Now))
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
		return gateway.CORS(n.cfg.GatewayOrigins, gateway.RequireKey(n.keys, mux))
	}, nil
}

// openMeter opens the coordinator's usage meter in the data dir. It closes after whatever
// is started later (the executor and its verifications, the gateway, the API).
func (n *Node) openMeter() error {
	var err error
	if n.meter, err = gateway.OpenMeter(n.cfg.DataDir); err != nil {
		return fmt.Errorf("coordinator usage meter: %w", err)
	}
	n.closers = append(n.closers, n.meter.Close)
	n.tasks = taskMeter{m: n.meter, now: n.cfg.Now, key: n.key, self: n.host.ID().String()}
	return nil
}

// taskMeter meters the finished API requests of a coordinator's clients. It holds the meter,
// a clock and the identity key that countersigns receipts, no network handle: it also wraps
// the local-only path.
type taskMeter struct {
	m    *gateway.Meter // nil: not a coordinator, nothing is metered
	now  func() time.Time
	key  crypto.PrivKey // countersigns the serving peers' receipts
	self string         // this node's peer ID, the countersigner
}

// Event returns the meter event of one finished request: its key and device (from the
// session RequireKey put in ctx), model, where it was served, tokens and time. ok is false
// when nothing is metered: not a coordinator, or no session (dispatch.Meter).
func (tm taskMeter) Event(ctx context.Context, model string, at inference.Served, res inference.Result, err error, took time.Duration) (e gateway.MeterEvent, ok bool) {
	if tm.m == nil {
		return e, false
	}
	s, ok := gateway.SessionFrom(ctx)
	if !ok {
		return e, false
	}
	outcome := gateway.OutcomeCompleted
	switch {
	case err != nil && ctx.Err() != nil:
		outcome = infer.OutcomeClientDisconnected // the client hung up: not the target's failure
	case err != nil:
		outcome = string(inference.CodeOf(err))
	}
	return gateway.MeterEvent{
		Time: tm.now(), KeyID: s.KeyID, Device: s.DeviceID, Model: model, Peer: at.Route(),
		TokensIn: res.Usage.PromptTokens, TokensOut: res.Usage.CompletionTokens,
		DurationMS: took.Milliseconds(), Outcome: outcome, Idempotency: gateway.IdempotencyFrom(ctx),
	}, true
}

// Countersign countersigns a serving peer's task receipt with this node's key
// (dispatch.Meter).
func (tm taskMeter) Countersign(receipt string) (sig, coordinator string, err error) {
	sig, err = receipts.Countersign(tm.key, receipt)
	return sig, tm.self, err
}

// Write records e, countersigning its receipt first. A failure is logged: the client was
// served either way (dispatch.Meter).
func (tm taskMeter) Write(e gateway.MeterEvent) {
	if e.Receipt != "" && e.Countersig == "" {
		sig, self, err := tm.Countersign(e.Receipt)
		if err != nil {
			log.Errorw("receipt not countersigned; metered without it", "key", e.KeyID, "err", err)
			e.Receipt = ""
		} else {
			e.Countersig, e.Coordinator = sig, self
		}
	}
	if err := tm.m.Record(e); err != nil {
		log.Errorw("usage not metered", "key", e.KeyID, "err", err)
	}
}

// record meters one finished request at once (see event and write).
func (tm taskMeter) record(ctx context.Context, model string, at inference.Served, res inference.Result, err error, took time.Duration) {
	if e, ok := tm.Event(ctx, model, at, res, err, took); ok {
		tm.Write(e)
	}
}

// meteredLocal meters the local-only requests a coordinator's clients send.
type meteredLocal struct {
	g  openai.Local
	tm taskMeter
}

// Generate runs req on the local-only path and meters it: a request that ended early with
// the tokens the client got and its prompt's bound, as the executor meters the others.
func (m meteredLocal) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	start := time.Now()
	delivered := 0
	res, err := m.g.Generate(ctx, req, func(t inference.Token) error {
		if err := emit(t); err != nil {
			return err
		}
		delivered++
		return nil
	})
	billed := res
	if err != nil {
		billed.Usage = req.UnfinishedUsage(delivered)
	}
	m.tm.record(ctx, req.Model, inference.Served{Tier: inference.TierLocal, Attempts: 1}, billed, err, time.Since(start))
	return res, err
}
