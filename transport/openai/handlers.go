package openai

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

// Handler returns the API's routes over d, for tests and for embedding in another server.
// Options as for New: WithLimits bounds the requests it accepts, WithLocal serves the
// local-only ones, WithDefaultPrefs sets the node's preferences; WithPublic means nothing
// here.
func Handler(d Dispatcher, opts ...Option) http.Handler {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.defaults.Validate(); err != nil {
		log.Errorw("default preferences dropped", "err", err)
		cfg.defaults = inference.Prefs{}
	}
	return newHandler(d, cfg)
}

// newHandler builds the routes; cfg.defaults is valid.
func newHandler(d Dispatcher, cfg config) http.Handler {
	h := &handler{
		d:        d,
		local:    cfg.local,
		limits:   cfg.limits,
		maxBody:  cfg.limits.MaxBodyBytes,
		defaults: cfg.defaults.Or(inference.DefaultPrefs()),
	}
	if h.maxBody <= 0 {
		h.maxBody = inference.DefaultLimits().MaxBodyBytes
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/models", h.models)
	mux.HandleFunc("/v1/models/{id...}", h.model)
	mux.HandleFunc("/v1/chat/completions", h.chat)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeErrorStatus(w, invalidf("no such endpoint: %s %s", r.Method, r.URL.Path), http.StatusNotFound)
	})
	return h.guard(mux)
}

type handler struct {
	d        Dispatcher
	local    Local // nil: local-only requests are refused with local_unavailable
	limits   inference.Limits
	maxBody  int64           // limits.MaxBodyBytes with its default applied
	defaults inference.Prefs // the node's preferences over inference.DefaultPrefs: every field set
}

// guard refuses cross-site browser requests and leaves the connection without a stale write
// deadline for its next request.
func (h *handler) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A web page may send a "simple" cross-origin POST (text/plain, no preflight) to a
		// loopback port, and this API accepts bodies whatever their Content-Type. Browsers
		// mark such requests with Origin; only a loopback page may use the API. Programs
		// (curl, SDKs, the CLI) send no Origin.
		if o := r.Header.Get("Origin"); o != "" && !loopbackOrigin(o) {
			writeErrorStatus(w, invalidf("cross-origin request from %q refused", o), http.StatusForbidden)
			return
		}
		defer func() { _ = http.NewResponseController(w).SetWriteDeadline(time.Time{}) }()
		next.ServeHTTP(w, r)
	})
}

func loopbackOrigin(origin string) bool {
	u, err := url.Parse(origin)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	writeErrorStatus(w, invalidf("method %s not allowed on %s; use %s", r.Method, r.URL.Path, allow), http.StatusMethodNotAllowed)
}

// models answers GET /v1/models.
func (h *handler) models(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, "GET, HEAD")
		return
	}
	ms := h.d.Models(r.Context())
	list := modelList{Object: objectList, Data: make([]modelObject, 0, len(ms))}
	for _, m := range ms {
		list.Data = append(list.Data, toModelObject(m))
	}
	writeJSON(w, http.StatusOK, list)
}

// model answers GET /v1/models/{id}; ids may contain slashes ("org/name").
func (h *handler) model(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, "GET, HEAD")
		return
	}
	id := r.PathValue("id")
	for _, m := range h.d.Models(r.Context()) {
		if m.ID == id {
			writeJSON(w, http.StatusOK, toModelObject(m))
			return
		}
	}
	writeError(w, inference.Errorf(inference.CodeModelNotFound, "model %q is not reachable from this node", id))
}

func toModelObject(m Model) modelObject {
	routes := m.Routes
	if routes == nil {
		routes = []string{}
	}
	return modelObject{ID: m.ID, Object: objectModel, OwnedBy: ownedBy,
		Meshinfer: modelMesh{Warm: m.Warm, Routes: routes, Deterministic: m.Deterministic}}
}

// chat answers POST /v1/chat/completions.
func (h *handler) chat(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, r, http.MethodPost)
		return
	}
	accepted := time.Now()
	req, e, status := h.decode(w, r)
	if e != nil {
		writeErrorStatus(w, e, status)
		return
	}
	ctx := r.Context()
	if t := req.Prefs.Timeout; t > 0 {
		// The whole request, from its acceptance, on either path: the Dispatcher and the
		// Local see the deadline (the router's gate counts it as the time left), and
		// terminalError reads this cause however they ended.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadlineCause(ctx, accepted.Add(t), inference.TimeLimitPassed(t))
		defer cancel()
	}
	gen := h.gate(&req.Request)
	id, created := newID(), accepted.Unix()
	// The response names the model that served it: the router's choice with route auto
	// (Served.Model), else the one asked for; "auto" when the Local chose one (it does not say).
	model := req.Model
	if model == "" {
		model = inference.AutoModel
	}
	if req.Stream {
		s := newStream(w, id, created, model, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
		res, at, err := gen(ctx, &req.Request, s.emit)
		s.finish(ctx, res, at, err)
		return
	}
	h.complete(ctx, w, req, gen, id, created, model)
}

// generateFunc is Dispatcher.Generate's signature: what serves one decoded request.
type generateFunc func(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error)

// gate is the privacy gate: a local-only request is served by the Local and never by the
// Dispatcher, which does not see it at all.
func (h *handler) gate(req *inference.Request) generateFunc {
	if req.Prefs.Privacy == inference.PrivacyLocalOnly {
		return h.generateLocal
	}
	return h.d.Generate
}

// generateLocal serves a local-only request on the Local. Its route is "local" and it is
// one attempt: there is never a second target.
func (h *handler) generateLocal(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
	if h.local == nil {
		return inference.Result{}, inference.Served{}, inference.Errorf(inference.CodeLocalUnavailable,
			"this API serves no local-only requests: it was given no local backend")
	}
	at := inference.Served{Tier: inference.TierLocal, Attempts: 1}
	res, err := h.local.Generate(ctx, req, func(t inference.Token) error { return emit(at, t) })
	return res, at, err
}

// decode reads, parses and checks the request body. It reads at most maxBody+1 bytes: a
// larger body is refused (413) after that, or before reading anything when its
// Content-Length already says so. The Content-Type is not checked: a body that parses is a
// request (curl users forget -H 'Content-Type: application/json').
func (h *handler) decode(w http.ResponseWriter, r *http.Request) (*chatRequest, *inference.Error, int) {
	tooLarge := func() (*chatRequest, *inference.Error, int) {
		return nil, invalidf("request body exceeds %d bytes", h.maxBody), http.StatusRequestEntityTooLarge
	}
	if r.ContentLength > h.maxBody {
		return tooLarge()
	}
	// Sized so that a body of its announced length is read without growing the buffer.
	buf := bytes.NewBuffer(make([]byte, 0, min(max(r.ContentLength, 0), h.maxBody)+bytes.MinRead))
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, h.maxBody)); err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return tooLarge()
		}
		return nil, invalidf("read request body: %v", err), http.StatusBadRequest
	}
	var req chatRequest
	if err := json.Unmarshal(buf.Bytes(), &req); err != nil {
		return nil, invalidf("request body is not a chat completion request: %v", err), http.StatusBadRequest
	}
	if req.N != nil && *req.N != 1 {
		return nil, invalidf("n must be 1, got %d", *req.N), http.StatusBadRequest
	}
	// Validate depends on the preferences (route auto needs no model): resolve them first.
	prefs, e := h.prefs(r.Header, req.Meshinfer)
	if e != nil {
		return nil, e, http.StatusBadRequest
	}
	req.Prefs = prefs
	if err := req.Validate(h.limits); err != nil {
		e := terminalError(r.Context(), err)
		return nil, e, e.Code.HTTPStatus()
	}
	return &req, nil, 0
}

// prefs resolves a request's preferences field by field: the body's meshinfer object, then
// the X-Meshinfer-* headers, then the node's defaults (which end in inference.DefaultPrefs).
// An unknown value in the body or a header, or a timeout not of inference.ParseTimeout's
// form, is an invalid_request naming the accepted ones.
func (h *handler) prefs(header http.Header, obj meshinferObject) (inference.Prefs, *inference.Error) {
	body, e := obj.checked()
	if e != nil {
		return inference.Prefs{}, e
	}
	var fromHeader inference.Prefs
	for _, f := range []struct {
		name string
		p    inference.Prefs
	}{
		{headerPrivacy, inference.Prefs{Privacy: inference.Privacy(header.Get(headerPrivacy))}},
		{headerPriority, inference.Prefs{Priority: inference.Priority(header.Get(headerPriority))}},
		{headerTransport, inference.Prefs{Transport: inference.Transport(header.Get(headerTransport))}},
	} {
		if err := f.p.Validate(); err != nil {
			return inference.Prefs{}, invalidf("%s header: %s", f.name, message(err))
		}
		fromHeader = fromHeader.Or(f.p)
	}
	var err error
	if fromHeader.Timeout, err = inference.ParseTimeout(header.Get(headerTimeout)); err != nil {
		return inference.Prefs{}, invalidf("%s header: %s", headerTimeout, message(err))
	}
	return body.Or(fromHeader).Or(h.defaults), nil
}

// message is an error's human-readable text without its code.
func message(err error) string {
	if e, ok := errors.AsType[*inference.Error](err); ok {
		return e.Message
	}
	return err.Error()
}

// complete serves a non-streaming request: it collects the tokens and answers once.
func (h *handler) complete(ctx context.Context, w http.ResponseWriter, req *chatRequest, gen generateFunc, id string, created int64, model string) {
	var (
		mu   sync.Mutex // guards seq and text against a Dispatcher that emits after returning
		seq  sequence
		text strings.Builder
	)
	res, at, err := gen(ctx, &req.Request, func(_ inference.Served, t inference.Token) error {
		mu.Lock()
		defer mu.Unlock()
		if err := seq.accept(t); err != nil {
			log.Warnw("dispatcher contract", "model", req.Model, "err", err)
			return err
		}
		text.WriteString(t.Text)
		return nil
	})
	mu.Lock()
	seq.done = true
	content := text.String()
	mu.Unlock()
	if err == nil {
		if err = checkResult(res); err != nil {
			log.Warnw("dispatcher contract", "model", req.Model, "err", err)
		}
	}
	setServed(w.Header(), at)
	if err != nil {
		writeError(w, terminalError(ctx, err))
		return
	}
	if at.Model != "" {
		model = at.Model // the router chose the model (route auto)
	}
	writeJSON(w, http.StatusOK, completion{
		ID: id, Object: objectCompletion, Created: created, Model: model,
		Choices: []completionChoice{{
			Message:      assistantMessage{Role: roleAssistant, Content: content},
			FinishReason: res.FinishReason,
		}},
		Usage:     res.Usage,
		Meshinfer: newServedInfo(at),
	})
}

// setServed writes the visibility headers of at; nothing when no route is known.
func setServed(h http.Header, at inference.Served) {
	if at.Route() == "" {
		return
	}
	h.Set(headerRoute, at.Route())
	if tier := string(at.Tier); tier != "" {
		h.Set(headerTier, tier)
	}
	h.Set(headerAttempts, strconv.Itoa(at.Attempts))
}

// newID returns a completion id: "chatcmpl-" and 96 random bits in hex.
func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return idPrefix + hex.EncodeToString(b[:])
}
