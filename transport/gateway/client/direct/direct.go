// Package direct is a thin client's direct path: the coordinator routes the request and
// relays a WebRTC set-up to the serving peer, and the tokens come over a data channel
// straight from that peer; the coordinator meters the task from the peer's receipt and
// never sees a token.
//
// It speaks the gateway's WebSocket messages "direct", "signal" and "direct_done"
// (transport/gateway's doc), the signaling of transport/webrtc (DialRelayed) and the
// answer half of transport/infer (ReadAnswer). Unlike transport/gateway/client it links
// libp2p packages (through those two), though it runs no libp2p host.
package direct

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/infer"
	"github.com/meshinfer/meshinfer/transport/webrtc"
)

// ErrNoChannel is returned (wrapped) when no data channel to the serving peer could be set
// up: nothing ran for the caller, which may send the request through the gateway instead
// (transport/gateway/client), as meshinfer chat --direct does.
var ErrNoChannel = errors.New("no direct channel to the serving peer")

// Result is a direct task's outcome: the text from the peer's channel, and the
// coordinator's record of it.
type Result struct {
	Text         string
	Tokens       int
	FinishReason inference.FinishReason
	Usage        inference.Usage
	Peer         string // where it ran: "peer:<id>"
	Receipt      string // the peer's signed receipt, as the coordinator metered it
	Countersig   string // the coordinator's countersignature of it
}

// Options configure Chat; the zero value is usable.
type Options struct {
	HTTPClient *http.Client          // for the WebSocket upgrade; nil: http.DefaultClient
	WebRTC     webrtc.RelayConfig    // ICE servers, set-up timeout, pion settings
	OnToken    func(inference.Token) // called for each token as it arrives
	// PlainHTTP allows sending the API key over plain http:// to another machine, on a
	// network the caller trusts (gateway.CheckKeyTransport); loopback is always allowed.
	PlainHTTP bool
	// Device names this device in gateway.DeviceHeader, as client.WithDevice does; the
	// coordinator meters the task under it. "" sends none.
	Device string
}

// ErrReceiptMismatch is returned, with the result, when the serving peer's receipt (which
// the coordinator metered) names another output than the tokens this client received: the
// peer vouched for something it did not send. Report it to the coordinator's operator.
var ErrReceiptMismatch = errors.New("the serving peer's receipt names another output than the one received")

// checkReceipt compares the output digest a task receipt names (its "result" field; the
// coordinator checked the signature) with the digest of what was received. No receipt (the
// task went unmetered) checks nothing.
func checkReceipt(receipt string, received inference.Digest) error {
	if receipt == "" {
		return nil
	}
	var r struct {
		Result string `json:"result"`
	}
	if err := json.Unmarshal([]byte(receipt), &r); err != nil {
		return fmt.Errorf("%w: the receipt does not decode: %v", ErrReceiptMismatch, err)
	}
	named, err := inference.ParseDigest(r.Result)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrReceiptMismatch, err)
	}
	if named != received {
		return fmt.Errorf("%w: receipt %s, received %s", ErrReceiptMismatch, named, received)
	}
	return nil
}

// outcomeWait bounds the wait for the coordinator's word on a task whose channel failed.
const outcomeWait = 5 * time.Second

// Chat sends body (a chat completion request object) to the coordinator at baseURL with API
// key key and returns the answer, streamed from the serving peer over WebRTC. Errors are
// the coordinator's or the peer's typed errors (*inference.Error) where there is one.
func Chat(ctx context.Context, baseURL, key string, body any, o Options) (Result, error) {
	if !o.PlainHTTP {
		if err := gateway.CheckKeyTransport(baseURL); err != nil {
			return Result{}, err
		}
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return Result{}, fmt.Errorf("encode the request: %w", err)
	}
	url := strings.TrimSuffix(baseURL, "/") + gateway.WebSocketPath
	h := http.Header{"Authorization": {"Bearer " + key}}
	if o.Device != "" {
		h.Set(gateway.DeviceHeader, o.Device)
	}
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: o.HTTPClient, HTTPHeader: h})
	if err != nil {
		switch {
		case resp != nil && resp.StatusCode == http.StatusUnauthorized:
			return Result{}, inference.Errorf(inference.CodeInvalidRequest, "the coordinator refused the API key (401)")
		case resp != nil && resp.StatusCode == http.StatusBadRequest:
			return Result{}, inference.Errorf(inference.CodeInvalidRequest, "the coordinator refused the request (400): %s", refusal(resp))
		}
		return Result{}, fmt.Errorf("connect to the gateway: %w", err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(gateway.MaxMessageBytes)
	const id = "direct"
	if err := writeJSON(ctx, ws, map[string]any{"type": "direct", "id": id, "body": json.RawMessage(raw)}); err != nil {
		return Result{}, fmt.Errorf("send the request: %w", err)
	}

	sig := newSignal(ctx, ws, id)
	done := make(chan struct{})
	var (
		outcome serverMessage
		readErr error
	)
	go func() { // ends when the connection ends (the deferred CloseNow at the latest)
		defer close(done)
		outcome, readErr = sig.readLoop()
	}()
	stopped := func() { // ends the connection and its reader
		ws.CloseNow()
		<-done
	}

	st, release, err := webrtc.DialRelayed(ctx, sig, o.WebRTC)
	if err != nil {
		stopped()
		if m := outcome; m.Type == "error" && m.Error != nil {
			return Result{}, inference.Errorf(inference.Code(m.Error.Code), "%s", m.Error.Message)
		}
		return Result{}, fmt.Errorf("%w: %w", ErrNoChannel, err)
	}
	defer release()
	// The peer is held to the request's bounds (max_tokens, a byte cap) as on any path. A
	// body the coordinator accepted decodes; one that did not never got this far.
	var req inference.Request
	_ = json.Unmarshal(raw, &req)
	var text strings.Builder
	n := 0
	got := inference.NewDigester()
	res, err := infer.NewClient(nil).ReadAnswer(ctx, st, "", &req, func(t inference.Token) error {
		n++
		text.WriteString(t.Text)
		got.Add(t)
		if o.OnToken != nil {
			o.OnToken(t)
		}
		return nil
	})
	if err != nil {
		// The coordinator says why the task ended early (its time limit, the peer lost),
		// typed, once the peer has reported it: wait for that a little, else the channel's
		// error is all there is.
		wait := time.NewTimer(outcomeWait)
		select {
		case <-done:
		case <-ctx.Done():
		case <-wait.C:
		}
		wait.Stop()
		stopped()
		if m := outcome; m.Type == "error" && m.Error != nil {
			return Result{}, inference.Errorf(inference.Code(m.Error.Code), "%s", m.Error.Message)
		}
		return Result{}, err
	}
	// The coordinator's record: direct_done once the peer reported the task.
	select {
	case <-done:
	case <-ctx.Done():
		stopped()
		return Result{}, ctx.Err()
	}
	if readErr != nil && outcome.Type == "" {
		return Result{}, fmt.Errorf("the coordinator's record of the task: %w", readErr)
	}
	out := Result{Text: text.String(), Tokens: n, FinishReason: res.FinishReason, Usage: res.Usage}
	switch outcome.Type {
	case "direct_done":
		out.Peer, out.Receipt, out.Countersig = outcome.Peer, outcome.Receipt, outcome.Countersig
		ws.Close(websocket.StatusNormalClosure, "")
		return out, checkReceipt(out.Receipt, got.Sum())
	case "error":
		return out, inference.Errorf(inference.Code(outcome.Error.Code), "%s", outcome.Error.Message)
	}
	return out, errors.New("the coordinator ended the connection without a record of the task")
}

// refusal is the message of the gateway's error answer resp (OpenAI's error JSON), or its
// status line when it has none.
func refusal(resp *http.Response) string {
	var body struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	// The websocket library leaves the first KiB of a refused upgrade's body readable.
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	if json.Unmarshal(b, &body) == nil && body.Error.Message != "" {
		return body.Error.Message
	}
	return resp.Status
}

// serverMessage is the part of the gateway's messages this package reads.
type serverMessage struct {
	Type       string `json:"type"`
	ID         string `json:"id"`
	Frame      string `json:"frame"`
	Peer       string `json:"peer"`
	Receipt    string `json:"receipt"`
	Countersig string `json:"countersig"`
	Error      *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeJSON(ctx context.Context, ws *websocket.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return ws.Write(wctx, websocket.MessageText, b)
}

// signal is a webrtc.SignalStream over the gateway's "signal" messages: each frame written
// (one whole frame per Write, as internal/frame writes them) goes out as one message, and
// the frames of incoming messages are read back as a byte stream.
type signal struct {
	ctx context.Context
	ws  *websocket.Conn
	id  string

	mu       sync.Mutex
	buf      bytes.Buffer  // incoming frames, encoded
	ready    chan struct{} // signalled when buf grows or the stream ends
	ended    error         // set once: reads fail with it when buf is empty
	deadline time.Time     // of reads; zero: none
	wdl      time.Time     // of writes
}

func newSignal(ctx context.Context, ws *websocket.Conn, id string) *signal {
	return &signal{ctx: ctx, ws: ws, id: id, ready: make(chan struct{}, 1)}
}

// readLoop reads the connection's messages, feeding signal frames to the stream, until the
// task's outcome (direct_done or error) or the connection's end.
func (s *signal) readLoop() (serverMessage, error) {
	defer s.end(io.EOF)
	for {
		_, b, err := s.ws.Read(s.ctx)
		if err != nil {
			s.end(err)
			return serverMessage{}, err
		}
		var m serverMessage
		if json.Unmarshal(b, &m) != nil || m.ID != s.id {
			continue
		}
		switch m.Type {
		case "signal":
			body, err := base64.StdEncoding.DecodeString(m.Frame)
			if err != nil || len(body) == 0 {
				continue
			}
			s.mu.Lock()
			s.buf.Write(frame.Append(nil, body))
			s.mu.Unlock()
			s.wake()
		case "direct_done":
			return m, nil
		case "error":
			if m.Error == nil {
				m.Error = &struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				}{string(inference.CodeUnavailable), "error without detail"}
			}
			s.end(fmt.Errorf("%s: %s", m.Error.Code, m.Error.Message))
			return m, nil
		}
	}
}

func (s *signal) wake() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

func (s *signal) end(err error) {
	s.mu.Lock()
	if s.ended == nil {
		s.ended = err
	}
	s.mu.Unlock()
	s.wake()
}

// Read reads incoming frames' bytes. One reader at a time (the set-up's).
func (s *signal) Read(p []byte) (int, error) {
	for {
		s.mu.Lock()
		if s.buf.Len() > 0 {
			n, _ := s.buf.Read(p)
			s.mu.Unlock()
			return n, nil
		}
		ended, dl := s.ended, s.deadline
		s.mu.Unlock()
		if ended != nil {
			return 0, ended
		}
		if dl.IsZero() {
			<-s.ready
			continue
		}
		d := time.Until(dl)
		if d <= 0 {
			return 0, os.ErrDeadlineExceeded
		}
		t := time.NewTimer(d)
		select {
		case <-s.ready: // buf grew, the stream ended or the deadline moved: look again
		case <-t.C:
		}
		t.Stop()
	}
}

// Write sends p, one whole frame, as a signal message.
func (s *signal) Write(p []byte) (int, error) {
	r := bytes.NewReader(p)
	body, err := frame.ReadOne(r, len(p))
	if err != nil || r.Len() != 0 || len(body) == 0 {
		return 0, errors.New("signal: a write must be exactly one frame")
	}
	s.mu.Lock()
	wdl := s.wdl
	s.mu.Unlock()
	ctx := s.ctx
	if !wdl.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, wdl)
		defer cancel()
	}
	msg, _ := json.Marshal(map[string]string{"type": "signal", "id": s.id, "frame": base64.StdEncoding.EncodeToString(body)})
	if err := s.ws.Write(ctx, websocket.MessageText, msg); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close and Reset end the relayed exchange on this side; the connection stays for the
// coordinator's record.
func (s *signal) Close() error { s.end(io.EOF); return nil }
func (s *signal) Reset() error { s.end(errors.New("signaling reset")); return nil }

func (s *signal) SetDeadline(t time.Time) error {
	s.mu.Lock()
	s.deadline, s.wdl = t, t
	s.mu.Unlock()
	s.wake()
	return nil
}

func (s *signal) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	s.deadline = t
	s.mu.Unlock()
	s.wake()
	return nil
}
