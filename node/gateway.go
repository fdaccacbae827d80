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
	}), gateway.WithDirect(n.relayDirect), gateway.WithOriginPatterns(n.cfg.GatewayOrigins))
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
// is started later (the dispatcher and its verifications, the gateway, the API).
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

// event returns the meter event of one finished request: its key (from the session
// RequireKey put in ctx), model, where it was served, tokens and time. ok is false when
// nothing is metered: not a coordinator, or no session.
func (tm taskMeter) event(ctx context.Context, model string, at openai.Served, res inference.Result, err error, took time.Duration) (e gateway.MeterEvent, ok bool) {
	if tm.m == nil {
		return e, false
	}
	s, ok := gateway.SessionFrom(ctx)
	if !ok {
		return e, false
	}
	outcome := gateway.OutcomeCompleted
	if err != nil {
		outcome = string(inference.CodeOf(err))
	}
	return gateway.MeterEvent{
		Time: tm.now(), KeyID: s.KeyID, Model: model, Peer: at.Route,
		TokensIn: res.Usage.PromptTokens, TokensOut: res.Usage.CompletionTokens,
		DurationMS: took.Milliseconds(), Outcome: outcome,
	}, true
}

// write records e, countersigning its receipt first. A failure is logged: the client was
// served either way.
func (tm taskMeter) write(e gateway.MeterEvent) {
	if e.Receipt != "" && e.Countersig == "" {
		sig, err := receipts.Countersign(tm.key, e.Receipt)
		if err != nil {
			log.Errorw("receipt not countersigned; metered without it", "key", e.KeyID, "err", err)
			e.Receipt = ""
		} else {
			e.Countersig, e.Coordinator = sig, tm.self
		}
	}
	if err := tm.m.Record(e); err != nil {
		log.Errorw("usage not metered", "key", e.KeyID, "err", err)
	}
}

// record meters one finished request at once (see event and write).
func (tm taskMeter) record(ctx context.Context, model string, at openai.Served, res inference.Result, err error, took time.Duration) {
	if e, ok := tm.event(ctx, model, at, res, err, took); ok {
		tm.write(e)
	}
}

// receiptFor checks the task receipt the serving peer sent with res: signed by the peer of
// r's last attempt, made out to this node, for r's model, completed, with the usage's token
// counts. sent, when non-nil, is the digest of the tokens the client received through this
// node, which the receipt must name; a direct task's client got them without this node, and
// the digest the receipt names is the peer's word, which verification checks. It returns
// that digest. A receipt that does not hold is counted as refused and ok is false: a missing
// or forged receipt changes nothing else (the client has its tokens; verification judges the
// output).
func (d *dispatcher) receiptFor(r *run, res inference.Result, sent *inference.Digest) (out inference.Digest, ok bool) {
	why := ""
	rc, err := receipts.ParseTask(res.Receipt)
	if err == nil {
		out, err = inference.ParseDigest(rc.Result)
	}
	switch {
	case res.Receipt == "":
		why = "no receipt"
	case err != nil:
		why = err.Error()
	case rc.Server != r.last.Peer.String():
		why = "signed by " + rc.Server + ", not the serving peer"
	case rc.Requester != d.n.host.ID().String():
		why = "made out to " + rc.Requester
	case rc.Model != r.req.Model || rc.Outcome != receipts.Completed:
		why = "wrong model or outcome"
	case rc.TokensIn != res.Usage.PromptTokens || rc.TokensOut != res.Usage.CompletionTokens:
		why = "token counts differ from the usage"
	case sent != nil && out != *sent:
		why = "result differs from the tokens received"
	}
	if why != "" {
		d.stats.receiptsRefused.Add(1)
		log.Warnw("serving peer's receipt refused; the task is metered without one", "peer", r.last.Peer, "model", r.req.Model, "why", why)
		return out, false
	}
	return out, true
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
