package gateway

import (
	"bytes"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/sse"
)

// runKey identifies a request across connections and restarts: the hex SHA-256 of its
// session and idempotency key (the session's ID never holds a NUL). It is what the
// idempotency records and the meter (MeterEvent.Idempotency) store, never the key itself.
func runKey(s Session, idempotencyKey string) string {
	sum := sha256.Sum256([]byte(s.ID() + "\x00" + idempotencyKey))
	return hex.EncodeToString(sum[:])
}

// runKeyKey is the context key of a run's runKey.
type runKeyKey struct{}

// IdempotencyFrom returns the runKey of the gateway run whose context ctx is (or derives
// from), or "" for a request without an idempotency key or not from the gateway. node's
// task meter records it in MeterEvent.Idempotency.
func IdempotencyFrom(ctx context.Context) string {
	k, _ := ctx.Value(runKeyKey{}).(string)
	return k
}

// attach returns the run that serves req for the session: the cached result of a
// completed request with the same idempotency key, the run of that request if it is still
// going (and not abandoned or failed), or else a new run. It counts the caller as a
// watcher. A request whose idempotency key names a run of another request (digest) is
// refused with errKeyReused; after Close every request is, with errShuttingDown.
func (g *WebSocket) attach(s Session, idempotencyKey string, digest [sha256.Size]byte, req *http.Request) (*run, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, errShuttingDown
	}
	var key string
	if idempotencyKey != "" {
		key = runKey(s, idempotencyKey)
		for _, r := range []*run{g.cache.get(key, g.now()), g.runs[key]} {
			switch {
			case r == nil:
			case r.digest != digest:
				return nil, errKeyReused
			case r.billed:
				return nil, errBilledNotKept
			case r.watch():
				return r, nil
			}
		}
		if g.runs[key] == nil && g.meter != nil && g.meter.Billed(key, g.now()) {
			return nil, errBilledNotKept
		}
	}
	ctx, cancel := context.WithCancelCause(withSession(g.ctx, s))
	if key != "" {
		ctx = context.WithValue(ctx, runKeyKey{}, key)
	}
	r := &run{key: key, digest: digest, cancel: cancel, changed: make(chan struct{}), watchers: 1}
	if key != "" {
		g.runs[key] = r
	}
	g.wg.Go(func() { g.serveRun(ctx, r, req.WithContext(ctx)) }) // ends with the API handler
	return r, nil
}

// serveRun runs req through the API, recording its events in r, then retires r.
func (g *WebSocket) serveRun(ctx context.Context, r *run, req *http.Request) {
	w := &eventWriter{r: r, header: make(http.Header), keep: g.keep}
	g.api.ServeHTTP(w, req)
	w.end(ctx)
	r.cancel(nil) // releases the context
	g.mu.Lock()
	defer g.mu.Unlock()
	if r.key == "" {
		return
	}
	if g.runs[r.key] == r {
		delete(g.runs, r.key)
	}
	if r.completed() {
		g.cache.put(r.key, r, g.now())
	}
}

// run is one request being served through the API, or its completed result: the tokens so
// far and, once it ended, its outcome. Forwarders of any number of connections watch it.
type run struct {
	key    string            // runKey; "" without an idempotency key: never cached nor attached to
	digest [sha256.Size]byte // of the request as run: a resubmission must be the same request
	cancel context.CancelCauseFunc
	billed bool // read back from a record without its tokens: answered errBilledNotKept

	mu        sync.Mutex
	tokens    []string      // texts, by index
	size      int           // bytes of tokens, for the cache's budget
	final     *outcome      // nil while running
	changed   chan struct{} // closed and replaced on every change
	watchers  int           // forwarders attached
	abandoned bool          // cancelled for want of watchers: never attached to again
	grace     *time.Timer   // running while no one watches
}

// outcome is the terminal message of a run, without the id it is sent under.
type outcome struct {
	done      bool
	finish    string
	usage     json.RawMessage
	meshinfer json.RawMessage
	code      string
	message   string
}

func (o *outcome) encode(id string) []byte {
	if o.done {
		return encode(doneMessage{Type: msgDone, ID: id, FinishReason: o.finish, Usage: o.usage, Meshinfer: o.meshinfer})
	}
	return encode(errorMessage{Type: msgError, ID: id, Error: errorDetail{Code: o.code, Message: o.message}})
}

// restoredRun is the completed run a record read back at start stands for.
func restoredRun(rc idemRecord) *run {
	r := &run{key: rc.Run, cancel: func(error) {}, changed: make(chan struct{}), billed: rc.Dropped, tokens: rc.Tokens,
		final: &outcome{done: true, finish: rc.Finish, usage: rc.Usage, meshinfer: rc.Meshinfer}}
	hex.Decode(r.digest[:], []byte(rc.Digest)) // valid: checked when read
	for _, t := range r.tokens {
		r.size += len(t) + 16
	}
	r.size += len(rc.Usage) + len(rc.Meshinfer)
	return r
}

// keep records the completed outcome o of r, synced, before r publishes it: once a client
// has its done message, a restarted coordinator still knows the request completed. A run
// without an idempotency key, or an endpoint without records, keeps nothing. A record that
// cannot be written is given up: the client gets its result all the same, and after a
// restart the meter alone tells that the request ran (errBilledNotKept).
func (g *WebSocket) keep(r *run, o outcome) {
	if g.recs == nil || r.key == "" {
		return
	}
	toks, _, _ := r.since(0)
	now := g.now()
	_ = g.recs.put(idemRecord{Time: now, Run: r.key, Digest: hex.EncodeToString(r.digest[:]), Tokens: toks,
		Finish: o.finish, Usage: o.usage, Meshinfer: o.meshinfer}, now)
}

// watch counts one more watcher, unless the run cannot serve one: abandoned, or ended in
// an error (a resubmission must be tried afresh, not answered with the old failure).
func (r *run) watch() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.abandoned || (r.final != nil && !r.final.done) {
		return false
	}
	r.watchers++
	if r.grace != nil {
		r.grace.Stop()
		r.grace = nil
	}
	return true
}

// detach counts one watcher less. A run left without watchers and still going is
// cancelled: at once when its client cancelled it (explicit) or no one can attach to it (no
// idempotency key), else after grace unless someone attached meanwhile.
func (r *run) detach(grace time.Duration, explicit bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watchers--
	if r.watchers > 0 || r.final != nil {
		return
	}
	if explicit || r.key == "" || grace == 0 {
		r.abandoned = true
		r.cancel(errCancelled)
		return
	}
	r.grace = time.AfterFunc(grace, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.watchers == 0 && r.final == nil && !r.abandoned {
			r.abandoned = true
			r.cancel(errAbandoned)
		}
	})
}

// since returns the tokens from index from, the outcome if the run ended, and a channel
// closed at the next change.
func (r *run) since(from int) ([]string, *outcome, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tokens[from:len(r.tokens):len(r.tokens)], r.final, r.changed
}

func (r *run) completed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.final != nil && r.final.done
}

func (r *run) bytes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.size
}

// token records the next token; false once the run ended.
func (r *run) token(text string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.final != nil {
		return false
	}
	r.tokens = append(r.tokens, text)
	r.size += len(text) + 16 // the string header
	r.notifyLocked()
	return true
}

// finish records the outcome; only the first counts.
func (r *run) finish(o outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.final != nil {
		return
	}
	r.final = &o
	r.size += len(o.usage) + len(o.meshinfer) + len(o.message)
	if r.grace != nil {
		r.grace.Stop()
		r.grace = nil
	}
	r.notifyLocked()
}

func (r *run) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// resultCache holds completed runs by runKey, oldest first: at most max entries and
// maxBytes of tokens, each for ttl. Its owner guards it.
type resultCache struct {
	max, maxBytes int
	ttl           time.Duration
	bytes         int
	order         *list.List // of *cacheEntry, oldest first
	byKey         map[string]*list.Element
}

type cacheEntry struct {
	key  string
	r    *run
	at   time.Time
	size int
}

func newResultCache(max, maxBytes int, ttl time.Duration) resultCache {
	return resultCache{max: max, maxBytes: maxBytes, ttl: ttl, order: list.New(), byKey: make(map[string]*list.Element)}
}

func (c *resultCache) get(key string, now time.Time) *run {
	c.expire(now)
	if e, ok := c.byKey[key]; ok {
		return e.Value.(*cacheEntry).r
	}
	return nil
}

func (c *resultCache) put(key string, r *run, now time.Time) {
	if e, ok := c.byKey[key]; ok {
		c.remove(e)
	}
	size := r.bytes()
	if size > c.maxBytes {
		return
	}
	c.byKey[key] = c.order.PushBack(&cacheEntry{key: key, r: r, at: now, size: size})
	c.bytes += size
	for c.order.Len() > c.max || c.bytes > c.maxBytes {
		c.remove(c.order.Front())
	}
	c.expire(now)
}

// expire drops the entries older than ttl; entries are in insertion order, so from the
// front.
func (c *resultCache) expire(now time.Time) {
	for e := c.order.Front(); e != nil && now.Sub(e.Value.(*cacheEntry).at) > c.ttl; e = c.order.Front() {
		c.remove(e)
	}
}

func (c *resultCache) remove(e *list.Element) {
	ce := c.order.Remove(e).(*cacheEntry)
	delete(c.byKey, ce.key)
	c.bytes -= ce.size
}

// eventWriter is the http.ResponseWriter a run's request is served with: it parses the
// API's answer, server-sent events or a JSON error, into the run's tokens and outcome.
// Only the API handler's goroutine uses it.
type eventWriter struct {
	r      *run
	keep   func(*run, outcome) // records a completed outcome before it is published
	header http.Header
	status int    // 0 until the header is written
	buf    []byte // SSE bytes not parsed yet, or the error body
	ended  bool   // the outcome is recorded
	done   outcome
	finish bool // the final chunk (with a finish reason) came
}

var errStreamEnded = errors.New("gateway: stream already ended")

func (w *eventWriter) Header() http.Header { return w.header }

func (w *eventWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

// Flush makes the API's flushes succeed; events are parsed as they are written.
func (w *eventWriter) Flush() {}

func (w *eventWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if w.ended {
		return 0, errStreamEnded
	}
	if w.status != http.StatusOK {
		w.buf = append(w.buf, b[:min(len(b), maxErrorBody-len(w.buf))]...)
		return len(b), nil
	}
	w.buf = append(w.buf, b...)
	rest, err := sse.Split(w.buf, MaxMessageBytes, w.event)
	switch {
	case errors.Is(err, io.EOF): // [DONE]
		if !w.finish {
			w.fail(inference.CodeUnavailable, "the API ended the stream without a finish reason")
		} else {
			w.done.done = true
			if w.keep != nil {
				w.keep(w.r, w.done)
			}
			w.r.finish(w.done)
			w.ended = true
		}
	case err != nil: // sse.ErrTooLong
		w.fail(inference.CodeUnavailable, "the API wrote an event larger than the gateway accepts")
		return 0, errStreamEnded
	}
	if w.ended {
		return len(b), nil
	}
	w.buf = append([]byte(nil), rest...) // do not keep the parsed prefix alive
	return len(b), nil
}

// sseChunk is what the gateway reads of an event of the API's stream.
type sseChunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage     json.RawMessage `json:"usage"`
	Meshinfer json.RawMessage `json:"meshinfer"`
	Error     *errorDetail    `json:"error"`
}

// event handles the data of one server-sent event of the API's stream (internal/sse). It
// reports whether to go on: false once the outcome is recorded.
func (w *eventWriter) event(data []byte) bool {
	var c sseChunk
	if err := json.Unmarshal(data, &c); err != nil {
		w.fail(inference.CodeUnavailable, "the API wrote an event the gateway cannot read")
		return false
	}
	if c.Error != nil {
		w.fail(inference.Code(c.Error.Code), c.Error.Message)
		return false
	}
	for _, ch := range c.Choices {
		if ch.Delta.Content != "" && !w.r.token(ch.Delta.Content) {
			w.ended = true
			return false
		}
		if ch.FinishReason != nil {
			w.finish, w.done.finish = true, *ch.FinishReason
		}
	}
	if len(c.Meshinfer) > 0 && string(c.Meshinfer) != "null" {
		w.done.meshinfer = bytes.Clone(c.Meshinfer)
	}
	if len(c.Usage) > 0 && string(c.Usage) != "null" {
		w.done.usage = bytes.Clone(c.Usage)
	}
	return true
}

func (w *eventWriter) fail(code inference.Code, msg string) {
	if code == "" {
		code = inference.CodeUnavailable
	}
	w.r.finish(outcome{code: string(code), message: msg})
	w.ended = true
}

// end records an outcome for a request the API answered without one: a JSON error (any
// status but 200), or a stream cut short.
func (w *eventWriter) end(ctx context.Context) {
	if w.ended {
		return
	}
	if w.status != 0 && w.status != http.StatusOK {
		var e errorBody
		if json.Unmarshal(w.buf, &e) == nil && e.Error.Code != "" {
			w.fail(inference.Code(e.Error.Code), e.Error.Message)
			return
		}
		w.fail(inference.CodeUnavailable, fmt.Sprintf("the API answered %d", w.status))
		return
	}
	if ie, ok := errors.AsType[*inference.Error](context.Cause(ctx)); ok && ctx.Err() != nil {
		w.fail(ie.Code, ie.Message)
		return
	}
	w.fail(inference.CodeUnavailable, "the API ended the stream without an outcome")
}
