package client_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/gateway/client"
	"github.com/meshinfer/meshinfer/transport/openai"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testModel = "synth-tiny"

// eventually polls cond every 5 ms until it holds or d passes, and reports whether it held
// at last: the one polling wait of this package's tests.
func eventually(d time.Duration, cond func() bool) bool {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			return cond()
		}
	}
	return true
}

// waitUsage totals the usage a coordinator in dir metered (all keys) until done holds or
// 10 s pass, and returns the last total: metering runs just after each response.
func waitUsage(t testing.TB, dir string, done func(gateway.Usage) bool) gateway.Usage {
	t.Helper()
	var total gateway.Usage
	eventually(10*time.Second, func() bool {
		usage, err := gateway.ReadUsage(filepath.Join(dir, gateway.UsageFile))
		if err != nil {
			t.Fatal(err)
		}
		total = gateway.Usage{}
		for _, u := range usage {
			total.Requests += u.Requests
			total.Completed += u.Completed
			total.TokensOut += u.TokensOut
		}
		return done(total)
	})
	return total
}

// dispatcher serves every request with the synthetic backend and meters it in a real
// gateway.Meter under the request's session, as a coordinator does. hold, if set, runs
// before generation and may block or fail the request.
type dispatcher struct {
	b     *synth.Backend
	meter *gateway.Meter
	calls atomic.Int64
	hold  func(ctx context.Context, call int64) error
}

func (d *dispatcher) Models(context.Context) []openai.Model {
	return []openai.Model{{ID: testModel, Warm: true, Routes: []string{"local"}}}
}

func (d *dispatcher) Generate(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (res inference.Result, at inference.Served, err error) {
	n := d.calls.Add(1)
	at = inference.Served{Tier: inference.TierLocal, Attempts: 1}
	start := time.Now()
	defer func() {
		s, ok := gateway.SessionFrom(ctx)
		if !ok {
			return
		}
		outcome := gateway.OutcomeCompleted
		if err != nil {
			outcome = string(inference.CodeOf(err))
		}
		d.meter.Record(gateway.MeterEvent{Time: time.Now(), KeyID: s.KeyID, Model: req.Model, Peer: at.Route(),
			TokensIn: res.Usage.PromptTokens, TokensOut: res.Usage.CompletionTokens,
			DurationMS: time.Since(start).Milliseconds(), Outcome: outcome, Idempotency: gateway.IdempotencyFrom(ctx)})
	}()
	if d.hold != nil {
		if err := d.hold(ctx, n); err != nil {
			return inference.Result{}, at, err
		}
	}
	res, err = d.b.Generate(ctx, req, func(t inference.Token) error { return emit(at, t) })
	return res, at, err
}

// gate holds requests until opened.
type gate struct {
	open    chan struct{}
	started chan struct{}
	ended   chan error
}

func newGate() *gate {
	return &gate{open: make(chan struct{}), started: make(chan struct{}, 64), ended: make(chan error, 64)}
}

func (g *gate) hold(ctx context.Context, _ int64) error {
	g.started <- struct{}{}
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		g.ended <- context.Cause(ctx)
		return context.Cause(ctx)
	}
}

// coordinator is a coordinator's API in miniature on a loopback port: RequireKey over the
// WebSocket endpoint (unless absent), GET /v1/usage and the OpenAI handler.
type coordinator struct {
	url string
	key string
	ks  *gateway.KeyStore
	d   *dispatcher
	hc  *http.Client
}

type fixtureOptions struct {
	noWebSocket bool
	hooks       gateway.WSTestHooks
	hold        func(ctx context.Context, call int64) error
}

func startCoordinator(t *testing.T, fo fixtureOptions) *coordinator {
	t.Helper()
	dir := t.TempDir()
	ks, err := gateway.OpenKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := ks.Create("alice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	meter, err := gateway.OpenMeter(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { meter.Close() })
	b, err := synth.New(testModel)
	if err != nil {
		t.Fatal(err)
	}
	d := &dispatcher{b: b, meter: meter, hold: fo.hold}
	api := openai.Handler(d)
	mux := http.NewServeMux()
	mux.Handle("/v1/usage", gateway.UsageHandler(meter))
	mux.Handle("/", api)
	var ws *gateway.WebSocket
	if !fo.noWebSocket {
		if ws, err = gateway.NewWebSocket(ks, api, gateway.WithTestHooks(fo.hooks)); err != nil {
			t.Fatal(err)
		}
		mux.Handle(gateway.WebSocketPath, ws)
	}
	srv := httptest.NewServer(gateway.RequireKey(ks, mux))
	tr := &http.Transport{}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
	if ws != nil {
		// Cleanups run last first: the endpoint closes its connections, then the server stops.
		t.Cleanup(func() { ws.Close() })
	}
	return &coordinator{url: srv.URL, key: key, ks: ks, d: d, hc: &http.Client{Transport: tr}}
}

// newClient returns a client of co with key, closed when the test ends.
func (co *coordinator) newClient(t *testing.T, key string, opts ...client.Option) *client.Client {
	t.Helper()
	c := client.New(co.url, key, append([]client.Option{client.WithHTTPClient(co.hc)}, opts...)...)
	t.Cleanup(func() { c.Close() })
	return c
}

// usage is the calling key's usage, from GET /v1/usage.
func (co *coordinator) usage(t *testing.T) gateway.Usage {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, co.url+"/v1/usage", nil)
	req.Header.Set("Authorization", "Bearer "+co.key)
	resp, err := co.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var u struct{ Usage gateway.Usage }
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&u) != nil {
		t.Fatalf("usage: status %d", resp.StatusCode)
	}
	return u.Usage
}

func chatBody(seed int64, maxTokens int) map[string]any {
	return map[string]any{
		"model":       testModel,
		"messages":    []map[string]string{{"role": "user", "content": "hello mesh"}},
		"max_tokens":  maxTokens,
		"temperature": 0.8,
		"seed":        seed,
	}
}

// reference runs a chatBody request on a fresh backend directly: the tokens every transport
// must deliver, and its result.
func reference(t *testing.T, seed int64, maxTokens int) ([]string, inference.Result) {
	t.Helper()
	b, err := synth.New(testModel)
	if err != nil {
		t.Fatal(err)
	}
	temp := 0.8
	req := inference.Request{Model: testModel, Messages: []inference.Message{{Role: inference.RoleUser, Content: "hello mesh"}},
		MaxTokens: &maxTokens, Temperature: &temp, Seed: &seed}
	var toks []string
	res, err := b.Generate(context.Background(), &req, func(tok inference.Token) error {
		toks = append(toks, tok.Text)
		return nil
	})
	if err != nil || len(toks) == 0 {
		t.Fatalf("reference: %d tokens, %v", len(toks), err)
	}
	return toks, res
}

// collector records the tokens a Chat call delivers and checks they come once each, in
// order.
type collector struct {
	t      *testing.T
	tokens []string
}

func (c *collector) on(tok client.Token) {
	if tok.Index != len(c.tokens) {
		c.t.Errorf("token %d delivered after %d tokens", tok.Index, len(c.tokens))
	}
	c.tokens = append(c.tokens, tok.Text)
}

// check fails unless the call delivered want and res agrees with it and ref.
func (c *collector) check(res client.Result, want []string, ref inference.Result, transport string) {
	c.t.Helper()
	if strings.Join(c.tokens, "\x00") != strings.Join(want, "\x00") {
		c.t.Fatalf("delivered %q, want %q", c.tokens, want)
	}
	if res.Text != strings.Join(want, "") || res.Tokens != len(want) || res.FinishReason != string(ref.FinishReason) ||
		res.Usage != ref.Usage || res.Transport != transport || res.Route != "local" || res.Tier != "local" || res.Attempts != 1 {
		c.t.Fatalf("result %+v, want %d tokens, %s, %+v over %s", res, len(want), ref.FinishReason, ref.Usage, transport)
	}
}
