package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

// writeTimeout bounds one write to a client (a whole non-streaming body, or one SSE event): a
// client that stops reading is cut off and its generation cancelled, instead of holding a
// backend slot forever. Same figure as the peer protocol's frame write timeout.
const writeTimeout = 30 * time.Second

// Header names of the meshinfer extension: preferences on requests, where it was served on
// responses.
const (
	headerPrivacy  = "X-Meshinfer-Privacy"
	headerPriority = "X-Meshinfer-Priority"
	// headerTransport asks for a transport to the serving peer (inference.Transport).
	headerTransport = "X-Meshinfer-Transport"
	// headerTimeout gives the request's time limit, a Go duration (inference.ParseTimeout).
	headerTimeout  = "X-Meshinfer-Timeout"
	headerRoute    = "X-Meshinfer-Route"
	headerTier     = "X-Meshinfer-Tier"
	headerAttempts = "X-Meshinfer-Attempts"
)

// routeLocal is the route of a request served on this device.
const routeLocal = "local"

var (
	// errContract reports a Dispatcher that broke its contract (a token out of order or
	// empty, emit after return, a result without a finish reason). The client gets
	// unavailable: the request was fine, the serving side was not.
	errContract = errors.New("dispatcher broke the stream contract")

	sseDone = []byte("data: [DONE]\n\n")
)

// setWriteDeadline arms the write deadline before a write. A ResponseWriter that cannot
// (httptest's recorder, some middleware) simply has none.
func setWriteDeadline(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(writeTimeout))
}

// sequence checks the token stream of one request against the Dispatcher's contract:
// indices 0, 1, …, non-empty texts, nothing after Generate returned. Its owner guards it
// with its mutex.
type sequence struct {
	n    int  // tokens accepted
	done bool // Generate returned
}

func (s *sequence) accept(t inference.Token) error {
	switch {
	case s.done:
		return fmt.Errorf("%w: emit after Generate returned", errContract)
	case t.Index != s.n:
		return fmt.Errorf("%w: token index %d, want %d", errContract, t.Index, s.n)
	case t.Text == "":
		return fmt.Errorf("%w: empty token %d", errContract, t.Index)
	}
	s.n++
	return nil
}

// checkResult reports a successful outcome that is not one: OpenAI clients need a
// finish_reason of stop or length.
func checkResult(res inference.Result) error {
	switch res.FinishReason {
	case inference.FinishStop, inference.FinishLength:
		return nil
	}
	return fmt.Errorf("%w: finish reason %q", errContract, res.FinishReason)
}

// stream writes one streaming response as server-sent events. Headers are written with the
// first token, or with the terminal outcome when there is none, so that a request that fails
// before its first token gets a plain JSON error with its HTTP status.
type stream struct {
	w            http.ResponseWriter
	rc           *http.ResponseController
	id           string
	created      int64
	model        string
	includeUsage bool

	// firstPrefix and prefix open a token event (the first one also carries the role); the
	// token's text, JSON-quoted, and tokenSuffix close it. Precomputed so that a token costs
	// one string encoding and one write.
	firstPrefix, prefix []byte

	// mu serializes everything below and the writes to w. Under the Dispatcher's contract it
	// is never contended (emit is synchronous and never follows the return), so holding it
	// across a write blocks nobody; it exists so that a Dispatcher breaking the contract
	// cannot write to w concurrently or after the handler returned.
	mu      sync.Mutex
	seq     sequence
	started bool   // headers written
	failed  error  // a write failed: the client is gone, write nothing more
	buf     []byte // the event being written
}

const tokenSuffix = `},"finish_reason":null}]}` + "\n\n"

func newStream(w http.ResponseWriter, id string, created int64, model string, includeUsage bool) *stream {
	s := &stream{w: w, rc: http.NewResponseController(w), id: id, created: created, includeUsage: includeUsage}
	s.setModel(model)
	return s
}

// setModel names the model in the events from now on and precomputes their prefixes.
func (s *stream) setModel(model string) {
	head, _ := json.Marshal(chunk{ID: s.id, Object: objectChunk, Created: s.created, Model: model})
	// head is {"id":…,"model":…,"choices":null}; cut before "null}" to append the choice.
	head = head[:len(head)-len("null}")]
	open := func(d string) []byte {
		return fmt.Appendf(nil, `data: %s[{"index":0,"delta":{%s"content":`, head, d)
	}
	s.model, s.firstPrefix, s.prefix = model, open(`"role":"assistant",`), open("")
}

// emit writes one token event and flushes it. It is the emit of the Dispatcher (or of the
// Local); its error (a broken contract, or the client gone) stops Generate.
func (s *stream) emit(at inference.Served, t inference.Token) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed != nil {
		return s.failed
	}
	if err := s.seq.accept(t); err != nil {
		log.Warnw("dispatcher contract", "err", err)
		return err
	}
	first := !s.started
	if first && at.Model != "" && at.Model != s.model {
		s.setModel(at.Model) // the router chose the model (route auto)
	}
	if first {
		s.start(at)
	}
	text, _ := json.Marshal(t.Text) // cannot fail for a string
	s.buf = s.buf[:0]
	if first {
		s.buf = append(s.buf, s.firstPrefix...)
	} else {
		s.buf = append(s.buf, s.prefix...)
	}
	s.buf = append(s.buf, text...)
	s.buf = append(s.buf, tokenSuffix...)
	return s.send(s.buf)
}

// finish writes the terminal outcome of Generate: the final chunk (and usage chunk) then
// [DONE], or an error. It is called once, after Generate returned.
func (s *stream) finish(ctx context.Context, res inference.Result, at inference.Served, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq.done = true
	if s.failed != nil {
		log.Debugw("client gone", "model", s.model, "err", s.failed)
		return
	}
	if err == nil {
		if err = checkResult(res); err != nil {
			log.Warnw("dispatcher contract", "model", s.model, "err", err)
		}
	}
	if err != nil {
		e := terminalError(ctx, err)
		if !s.started {
			setServed(s.w.Header(), at)
			writeError(s.w, e)
			return
		}
		// Tokens were sent: the status is 200 already. One error event ends the stream,
		// without [DONE], so that no client takes the cut stream for a complete one.
		ev := append([]byte("data: "), encodeError(e, e.Code.HTTPStatus())...)
		s.send(append(ev, "\n\n"...))
		return
	}
	if !s.started {
		// No token: the client still gets the role, then the final chunk.
		s.start(at)
		empty := ""
		if s.event(s.chunk(delta{Role: roleAssistant, Content: &empty}, nil, nil)) != nil {
			return
		}
	}
	fr := res.FinishReason
	info := newServedInfo(at)
	if s.event(s.chunk(delta{}, &fr, &info)) != nil {
		return
	}
	if s.includeUsage {
		usage := res.Usage
		c := chunk{ID: s.id, Object: objectChunk, Created: s.created, Model: s.model,
			Choices: []chunkChoice{}, Usage: &usage}
		if s.event(c) != nil {
			return
		}
	}
	s.send(sseDone)
}

// start writes the headers of a 200 event stream, where at is where its first token (or, with
// none, its outcome) was served.
func (s *stream) start(at inference.Served) {
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // reverse proxies (nginx) must not buffer the stream
	setServed(h, at)
	s.started = true
	setWriteDeadline(s.w)
	s.w.WriteHeader(http.StatusOK)
}

func (s *stream) chunk(d delta, fr *inference.FinishReason, ri *servedInfo) chunk {
	return chunk{ID: s.id, Object: objectChunk, Created: s.created, Model: s.model,
		Choices: []chunkChoice{{Delta: d, FinishReason: fr}}, Meshinfer: ri}
}

// event writes c as one data event.
func (s *stream) event(c chunk) error {
	b, _ := json.Marshal(c) // cannot fail: our types only
	s.buf = append(append(append(s.buf[:0], "data: "...), b...), "\n\n"...)
	return s.send(s.buf)
}

// send writes one event and flushes it at once: no batching, each token reaches the client
// as it is produced. A failure marks the stream failed.
func (s *stream) send(b []byte) error {
	_ = s.rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := s.w.Write(b)
	if err == nil {
		if err = s.rc.Flush(); errors.Is(err, http.ErrNotSupported) {
			err = nil // the writer buffers; the stream is still correct, only late
		}
	}
	if err != nil {
		s.failed = fmt.Errorf("write to client: %w", err)
		return s.failed
	}
	return nil
}
