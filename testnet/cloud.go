package testnet

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// DefaultCloudLatency is the testnet cloud's added latency before a response starts: about
// what a hosted API's network round trips and queue add to its first token.
const DefaultCloudLatency = 300 * time.Millisecond

// Cloud is the testnet's stand-in for a cloud API, so that the router's cloud tier runs for
// real on loopback: a meshinfer OpenAI-compatible API (transport/openai) over the built-in
// synthetic models, all loaded at start, that waits Latency before generating each
// response. Nodes use it as their cloud tier (node.Config.CloudURL). Its counters show what
// the router did to it, e.g. that a speculative stream was cancelled.
type Cloud struct {
	srv     *openai.Server
	backend *synth.Backend
	models  []string
	latency time.Duration

	requests, completed, cancelled, failed atomic.Uint64
}

// CloudStats counts the cloud's chat requests by outcome.
type CloudStats struct {
	Requests  uint64 `json:"requests"`
	Completed uint64 `json:"completed"`
	Cancelled uint64 `json:"cancelled"` // the client went away before the end
	Failed    uint64 `json:"failed"`
}

// StartCloud loads models and serves them on addr ("127.0.0.1:0" for any port) with the
// given added latency.
func StartCloud(addr string, latency time.Duration, models ...string) (*Cloud, error) {
	b, err := synth.New(models...)
	if err != nil {
		return nil, fmt.Errorf("testnet cloud: %w", err)
	}
	for _, m := range models {
		if err := b.Load(context.Background(), m); err != nil {
			return nil, fmt.Errorf("testnet cloud: load %s: %w", m, err)
		}
	}
	c := &Cloud{backend: b, models: models, latency: latency}
	if c.srv, err = openai.New(addr, cloudDispatcher{c}); err != nil {
		return nil, fmt.Errorf("testnet cloud: %w", err)
	}
	return c, nil
}

// URL is the cloud's base URL, for node.Config.CloudURL.
func (c *Cloud) URL() string { return "http://" + c.srv.Addr() }

// Models are the models the cloud serves.
func (c *Cloud) Models() []string { return append([]string(nil), c.models...) }

// Stats returns the counters.
func (c *Cloud) Stats() CloudStats {
	return CloudStats{
		Requests: c.requests.Load(), Completed: c.completed.Load(),
		Cancelled: c.cancelled.Load(), Failed: c.failed.Load(),
	}
}

// Close stops the server.
func (c *Cloud) Close() error { return c.srv.Close() }

// cloudDispatcher serves the cloud's API from its synthetic backend.
type cloudDispatcher struct{ c *Cloud }

func (d cloudDispatcher) Models(ctx context.Context) []openai.Model {
	var out []openai.Model
	for _, m := range d.c.models {
		out = append(out, openai.Model{ID: m, Warm: true, Routes: []string{"local"}, Deterministic: true})
	}
	return out
}

func (d cloudDispatcher) Generate(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
	c := d.c
	c.requests.Add(1)
	at := inference.Served{Tier: inference.TierLocal, Attempts: 1}
	t := time.NewTimer(c.latency)
	defer t.Stop()
	select {
	case <-ctx.Done():
		c.cancelled.Add(1)
		return inference.Result{}, at, ctx.Err()
	case <-t.C:
	}
	clientGone := false
	res, err := c.backend.Generate(ctx, req, func(tok inference.Token) error {
		err := emit(at, tok)
		clientGone = err != nil
		return err
	})
	switch {
	case err == nil:
		c.completed.Add(1)
	case clientGone || ctx.Err() != nil || errors.Is(err, context.Canceled):
		c.cancelled.Add(1)
	default:
		c.failed.Add(1)
	}
	return res, at, err
}
