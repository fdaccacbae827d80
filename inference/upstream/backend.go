package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

// Timeouts and sizes; see the package documentation for how each is used.
const (
	// DefaultFirstTokenTimeout bounds the wait for the first token. A cold load of a
	// multi-gigabyte model from disk plus processing a long prompt on a CPU takes tens of
	// seconds; a minute allows that while still ending a hung upstream.
	DefaultFirstTokenTimeout = 60 * time.Second
	// DefaultIdleTimeout bounds the gap between two tokens. It is longer than the peer
	// protocol's inter-token timeout (5 s, transport/infer): a cloud API or a local server
	// may pause mid-stream (deltas without content, reasoning or a tool call's arguments,
	// do not feed this clock), and a local request has nowhere else to go. A peer served
	// through this backend is held to the 5 s by its requester all the same.
	DefaultIdleTimeout = 30 * time.Second
	// DefaultModelsTimeout bounds GET /v1/models; a listing is quick or the upstream is in
	// trouble.
	DefaultModelsTimeout = 2 * time.Second
	// listingTTL is how long a listing (or the failure to get one) answers Models: the node
	// asks on every routed request, every announcement and every /v1/models of its API, and
	// a model's warm state may lag by this much.
	listingTTL = 3 * time.Second
	// maxLine bounds one line of the event stream, in bytes. A chunk is a few hundred bytes;
	// 1 MiB leaves room for servers that attach log probabilities or long usage details.
	maxLine = 1 << 20
	// maxTokenText bounds one emitted Token's text, in bytes; a longer delta is cut into
	// several Tokens. A token frame of the peer protocol holds 4 KiB.
	maxTokenText = 1 << 10
	// maxErrorBody bounds how much of an error response is read, in bytes: error JSON is
	// small, and a server that answers with a large HTML page needs no more to be mapped.
	maxErrorBody = 64 << 10
	// maxModelsBody bounds GET /v1/models' body, in bytes: cloud routers list hundreds of
	// models with descriptions.
	maxModelsBody = 4 << 20
)

// Option configures a Backend.
type Option func(*Backend)

// WithAPIKey sets the key sent as "Authorization: Bearer <key>". An empty key sends no
// Authorization header (the default).
func WithAPIKey(key string) Option { return func(b *Backend) { b.apiKey = key } }

// WithHTTPClient sets the client requests go through, e.g. one with a proxy or custom TLS.
// Its Timeout, if any, bounds whole streams: leave it zero and use WithTimeouts. The default
// is a client of the Backend's own, with http.DefaultTransport's settings.
func WithHTTPClient(c *http.Client) Option {
	return func(b *Backend) { b.client, b.ownClient = c, false }
}

// WithModelsTimeout sets how long a model listing (GET /v1/models) may take; zero or
// negative keeps DefaultModelsTimeout. The listing runs in the background, so this bounds
// how stale the warm states can get, not how long a caller waits.
func WithModelsTimeout(d time.Duration) Option {
	return func(b *Backend) {
		if d > 0 {
			b.modelsTimeout = d
		}
	}
}

// WithTimeouts sets the first-token and idle timeouts; a zero or negative value keeps that
// default (DefaultFirstTokenTimeout, DefaultIdleTimeout).
func WithTimeouts(firstToken, idle time.Duration) Option {
	return func(b *Backend) {
		if firstToken > 0 {
			b.firstToken = firstToken
		}
		if idle > 0 {
			b.idle = idle
		}
	}
}

// Backend serves the configured models through an OpenAI-compatible server. It is safe for
// concurrent use and holds nothing between requests but the HTTP client's pooled connections.
type Backend struct {
	base             string   // scheme://host[:port][/path], without a trailing "/" or "/v1"
	names            []string // served models, in New's order; read-only after New
	apiKey           string
	client           *http.Client
	ownClient        bool // client was made by New: Close closes its idle connections
	firstToken, idle time.Duration
	modelsTimeout    time.Duration

	// The upstream's latest model listing and when it was taken. Models answers from it at
	// once; one older than listingTTL is refreshed in the background, one request at a time,
	// under the backend's own context (never a caller's: a client that hangs up must not
	// leave "nothing warm" behind), so that no routing decision waits on the upstream.
	listMu     sync.Mutex
	listing    map[string]bool // listed model → deterministic
	listedAt   time.Time
	refreshing bool
	// The refresh goroutine's owner is the backend: Close cancels bg and waits for it.
	bg       context.Context
	bgCancel context.CancelFunc
	bgWG     sync.WaitGroup
}

var _ inference.Backend = (*Backend)(nil)

// New returns a backend that forwards requests for models to the server at baseURL, an
// http or https URL such as "http://127.0.0.1:8080". A trailing "/v1" is accepted and dropped
// (OpenAI SDKs are configured with it), so both forms name the same server. models are the
// upstream's names for the models this backend serves: at least one, none empty or repeated.
// New does no I/O.
func New(baseURL string, models []string, opts ...Option) (*Backend, error) {
	base, err := parseBase(baseURL)
	if err != nil {
		return nil, err
	}
	if len(models) == 0 {
		return nil, errors.New("upstream: no models given")
	}
	for i, m := range models {
		if m == "" {
			return nil, errors.New("upstream: empty model name")
		}
		if slices.Contains(models[:i], m) {
			return nil, fmt.Errorf("upstream: model %q given twice", m)
		}
	}
	b := &Backend{
		base:          base,
		names:         slices.Clone(models),
		firstToken:    DefaultFirstTokenTimeout,
		idle:          DefaultIdleTimeout,
		modelsTimeout: DefaultModelsTimeout,
	}
	if t, ok := http.DefaultTransport.(*http.Transport); ok {
		b.client, b.ownClient = &http.Client{Transport: t.Clone()}, true
	} else {
		b.client = http.DefaultClient
	}
	for _, o := range opts {
		o(b)
	}
	if b.client == nil {
		return nil, errors.New("upstream: nil http client")
	}
	b.bg, b.bgCancel = context.WithCancel(context.Background())
	return b, nil
}

func parseBase(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("upstream: base URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("upstream: base URL %q: want http://host:port or https://host", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("upstream: base URL %q: no query or fragment allowed", raw)
	}
	u.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v1")
	u.RawPath = ""
	return strings.TrimSuffix(u.String(), "/"), nil
}

// Close stops a model listing in progress and releases the idle connections of the
// backend's own HTTP client (not those of a client given with WithHTTPClient). Requests in
// flight are not affected, and the backend stays usable for them (Models then answers from
// its last listing). It always returns nil.
func (b *Backend) Close() error {
	b.bgCancel()
	b.bgWG.Wait()
	if b.ownClient {
		b.client.CloseIdleConnections()
	}
	return nil
}

// Models lists the configured models; Warm is true for those the upstream's latest GET
// /v1/models listed, and Deterministic for those it listed with meshinfer's
// "meshinfer":{"deterministic":true} (another meshinfer node, serving a built-in model). It
// answers from memory and never fails: before the first listing, and while the upstream
// does not answer, every model is cold (see the package documentation).
func (b *Backend) Models(context.Context) ([]inference.ModelInfo, error) {
	listed := b.cachedListing()
	infos := make([]inference.ModelInfo, 0, len(b.names))
	for _, name := range b.names {
		det, warm := listed[name]
		infos = append(infos, inference.ModelInfo{Name: name, Warm: warm, Deterministic: det})
	}
	return infos, nil
}

// cachedListing returns the latest listing and, when it is listingTTL old (or there is
// none yet), starts one refresh in the background unless one is running.
func (b *Backend) cachedListing() map[string]bool {
	b.listMu.Lock()
	defer b.listMu.Unlock()
	stale := b.listedAt.IsZero() || time.Since(b.listedAt) >= listingTTL
	if stale && !b.refreshing && b.bg.Err() == nil {
		b.refreshing = true
		b.bgWG.Add(1)
		go func() { // ends when the listing request does: its timeout, or Close
			defer b.bgWG.Done()
			listing := b.listed(b.bg)
			b.listMu.Lock()
			defer b.listMu.Unlock()
			b.refreshing = false
			if b.bg.Err() == nil {
				b.listing, b.listedAt = listing, time.Now()
			}
		}()
	}
	return b.listing
}

// listed returns the ids the upstream lists, each with whether it says the model is
// deterministic, or nil when it cannot tell.
func (b *Backend) listed(ctx context.Context) map[string]bool {
	ctx, cancel := context.WithTimeout(ctx, b.modelsTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.base+"/v1/models", nil)
	if err != nil {
		return nil
	}
	b.authorize(req)
	resp, err := b.client.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	var list struct {
		Data []struct {
			ID        string `json:"id"`
			Meshinfer struct {
				Deterministic bool `json:"deterministic"`
			} `json:"meshinfer"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxModelsBody)).Decode(&list); err != nil {
		return nil
	}
	ids := make(map[string]bool, len(list.Data))
	for _, m := range list.Data {
		ids[m.ID] = m.Meshinfer.Deterministic
	}
	return ids
}

func (b *Backend) authorize(req *http.Request) {
	if b.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+b.apiKey)
	}
}

// chatRequest is the body sent upstream.
type chatRequest struct {
	Model         string              `json:"model"`
	Messages      []inference.Message `json:"messages"`
	MaxTokens     int                 `json:"max_tokens"`
	Temperature   *float64            `json:"temperature,omitempty"`
	TopP          *float64            `json:"top_p,omitempty"`
	Seed          *int64              `json:"seed,omitempty"`
	Stop          []string            `json:"stop,omitempty"`
	Stream        bool                `json:"stream"`
	StreamOptions streamOptions       `json:"stream_options"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// Generate runs one completion on the upstream; see inference.Backend for the contract and
// the package documentation for the request sent and the mapping of failures.
func (b *Backend) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	if !slices.Contains(b.names, req.Model) {
		return inference.Result{}, inference.Errorf(inference.CodeModelNotFound,
			"model %q is not served here (serving %s)", req.Model, strings.Join(b.names, ", "))
	}
	if err := req.Validate(inference.NoSizeLimits()); err != nil {
		return inference.Result{}, err
	}
	body, err := json.Marshal(chatRequest{
		Model:         req.Model,
		Messages:      req.Messages,
		MaxTokens:     req.EffectiveMaxTokens(),
		Temperature:   req.Temperature,
		TopP:          req.TopP,
		Seed:          req.Seed,
		Stop:          req.Stop,
		Stream:        true,
		StreamOptions: streamOptions{IncludeUsage: true},
	})
	if err != nil { // Validate rules out what Marshal refuses (NaN, invalid UTF-8)
		return inference.Result{}, inference.Errorf(inference.CodeInvalidRequest, "encode request: %v", err)
	}
	if err := ctx.Err(); err != nil {
		return inference.Result{}, fmt.Errorf("upstream: %w", err)
	}

	// rctx ends the HTTP exchange: when ctx ends, when a timeout passes (with a timeout
	// *inference.Error as its cause), or when Generate returns.
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := newWatchdog(cancel, b.firstToken, b.idle)
	defer w.stop()

	hreq, err := http.NewRequestWithContext(rctx, http.MethodPost, b.base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return inference.Result{}, inference.Errorf(inference.CodeUnavailable, "upstream request: %v", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	b.authorize(hreq)

	resp, err := b.client.Do(hreq)
	if err != nil {
		if cerr := cause(ctx, rctx); cerr != nil {
			return inference.Result{}, cerr
		}
		return inference.Result{}, transportError(err)
	}
	// Closing the body is what unblocks a read in progress: net/http does it when rctx ends,
	// and so does this, for clients whose transport does not watch the context.
	stopClose := context.AfterFunc(rctx, func() { resp.Body.Close() })
	defer func() {
		stopClose()
		resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		herr := statusError(resp.StatusCode, io.LimitReader(resp.Body, maxErrorBody))
		if cerr := cause(ctx, rctx); cerr != nil {
			return inference.Result{}, cerr
		}
		return inference.Result{}, herr
	}

	var emitErr error
	res, err := readStream(resp.Body, func(t inference.Token) error {
		w.pause()
		if cerr := cause(ctx, rctx); cerr != nil {
			return cerr
		}
		if emitErr = emit(t); emitErr != nil {
			return emitErr
		}
		w.resume()
		return nil
	})
	switch {
	case err == nil:
		return res, nil
	case emitErr != nil:
		return inference.Result{}, emitErr // unchanged, as the contract requires
	}
	// A read cut short because rctx ended fails with a read error: report why it ended.
	if cerr := cause(ctx, rctx); cerr != nil {
		return inference.Result{}, cerr
	}
	return inference.Result{}, err
}

// cause returns why rctx ended, or nil if it has not: the caller's ctx error (wrapped), or the
// watchdog's timeout error.
func cause(ctx, rctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	if rctx.Err() == nil {
		return nil
	}
	return context.Cause(rctx)
}

// watchdog enforces the first-token and idle timeouts by cancelling the exchange's context
// with a timeout error as its cause. Its timers' functions run on their own goroutines and
// only cancel; everything else is called on Generate's goroutine.
type watchdog struct {
	cancel    context.CancelCauseFunc
	idleAfter time.Duration
	first     *time.Timer // armed until the first token
	idle      *time.Timer // armed from the first token on, reset by each
}

func newWatchdog(cancel context.CancelCauseFunc, firstToken, idle time.Duration) *watchdog {
	err := inference.Errorf(inference.CodeTimeout, "upstream sent no token within %v", firstToken)
	return &watchdog{
		cancel:    cancel,
		idleAfter: idle,
		first:     time.AfterFunc(firstToken, func() { cancel(err) }),
	}
}

// pause stops the clocks while a token is handed to emit: a slow consumer downstream is not
// the upstream's delay. If a timer fired already, the context is cancelled and the caller
// sees it.
func (w *watchdog) pause() {
	w.first.Stop()
	if w.idle != nil {
		w.idle.Stop()
	}
}

// resume starts the idle clock once emit has returned.
func (w *watchdog) resume() {
	if w.idle != nil {
		w.idle.Reset(w.idleAfter)
		return
	}
	err := inference.Errorf(inference.CodeTimeout, "upstream sent no token for %v", w.idleAfter)
	w.idle = time.AfterFunc(w.idleAfter, func() { w.cancel(err) })
}

func (w *watchdog) stop() {
	w.first.Stop()
	if w.idle != nil {
		w.idle.Stop()
	}
}
