package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/transport/openai"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wsDispatcher serves every request with the synthetic backend; hold, if set, runs before
// generation and may block (a request held in flight) or fail it. It counts what it serves.
type wsDispatcher struct {
	b     *synth.Backend
	calls atomic.Int64
	hold  func(ctx context.Context) error
}

func newWSDispatcher(t testing.TB) *wsDispatcher {
	t.Helper()
	b, err := synth.New("synth-tiny")
	if err != nil {
		t.Fatal(err)
	}
	return &wsDispatcher{b: b}
}

func (d *wsDispatcher) Models(context.Context) []openai.Model {
	return []openai.Model{{ID: "synth-tiny", Warm: true, Routes: []string{"local"}}}
}

func (d *wsDispatcher) Generate(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
	d.calls.Add(1)
	at := inference.Served{Tier: inference.TierLocal, Attempts: 1}
	if d.hold != nil {
		if err := d.hold(ctx); err != nil {
			return inference.Result{}, at, err
		}
	}
	res, err := d.b.Generate(ctx, req, func(t inference.Token) error { return emit(at, t) })
	return res, at, err
}

// gate holds requests until opened; started receives one value per request held.
type gate struct {
	open    chan struct{}
	started chan struct{}
	ended   chan error // the context's cause when a held request was cancelled
}

func newGate() *gate {
	return &gate{open: make(chan struct{}), started: make(chan struct{}, 64), ended: make(chan error, 64)}
}

func (g *gate) hold(ctx context.Context) error {
	g.started <- struct{}{}
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		g.ended <- context.Cause(ctx)
		return context.Cause(ctx)
	}
}

// wsFixture is a coordinator's API in miniature: RequireKey over a mux with the WebSocket
// endpoint and the OpenAI handler, on a loopback port.
type wsFixture struct {
	base string // http://127.0.0.1:port
	key  string
	ks   *KeyStore
	d    *wsDispatcher
	ws   *WebSocket
	hc   *http.Client
}

func startWS(t *testing.T, d *wsDispatcher, opts ...WSOption) *wsFixture {
	t.Helper()
	ks := openKeys(t, t.TempDir())
	key, _ := createKey(t, ks, "alice")
	return startWSKeys(t, d, ks, key, opts...)
}

// startWSKeys is startWS with the key store ks, whose key key the fixture uses: two
// fixtures on one store stand for one coordinator before and after a restart.
func startWSKeys(t *testing.T, d *wsDispatcher, ks *KeyStore, key string, opts ...WSOption) *wsFixture {
	t.Helper()
	api := openai.Handler(d)
	ws, err := NewWebSocket(ks, api, opts...)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(WebSocketPath, ws)
	mux.Handle("/", api)
	srv := httptest.NewServer(RequireKey(ks, mux))
	tr := &http.Transport{}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
	t.Cleanup(func() {
		if err := ws.Close(); err != nil {
			t.Error(err)
		}
	})
	return &wsFixture{base: srv.URL, key: key, ks: ks, d: d, ws: ws, hc: &http.Client{Transport: tr}}
}

// rawConn is a WebSocket client that speaks the wire format by hand.
type rawConn struct {
	t *testing.T
	c *websocket.Conn
}

func (f *wsFixture) dial(t *testing.T, header http.Header) (*rawConn, *http.Response, error) {
	t.Helper()
	if header == nil {
		header = http.Header{"Authorization": {"Bearer " + f.key}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, f.base+WebSocketPath, &websocket.DialOptions{HTTPClient: f.hc, HTTPHeader: header})
	if err != nil {
		return nil, resp, err
	}
	c.SetReadLimit(MaxMessageBytes)
	t.Cleanup(func() { c.CloseNow() })
	return &rawConn{t: t, c: c}, resp, nil
}

func (f *wsFixture) mustDial(t *testing.T) *rawConn {
	t.Helper()
	rc, _, err := f.dial(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

func (rc *rawConn) sendRaw(typ websocket.MessageType, b []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return rc.c.Write(ctx, typ, b)
}

func (rc *rawConn) send(v any) {
	rc.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		rc.t.Fatal(err)
	}
	if err := rc.sendRaw(websocket.MessageText, b); err != nil {
		rc.t.Fatal(err)
	}
}

// request sends a request message with body (any JSON value) and optional headers.
func (rc *rawConn) request(id, idem string, body any, headers map[string]string) {
	rc.t.Helper()
	rc.send(map[string]any{"type": "request", "id": id, "idempotency_key": idem, "body": body, "headers": headers})
}

// wireMsg is any message from the server, as a client decodes it.
type wireMsg struct {
	Type         string          `json:"type"`
	ID           string          `json:"id"`
	Index        int             `json:"index"`
	Text         string          `json:"text"`
	FinishReason string          `json:"finish_reason"`
	Usage        json.RawMessage `json:"usage"`
	Meshinfer    json.RawMessage `json:"meshinfer"`
	Error        *errorDetail    `json:"error"`
	TS           int64           `json:"ts"`
}

// read returns the next message, or the error that ended the connection.
func (rc *rawConn) read() (wireMsg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	typ, b, err := rc.c.Read(ctx)
	if err != nil {
		return wireMsg{}, err
	}
	var m wireMsg
	if typ != websocket.MessageText || json.Unmarshal(b, &m) != nil {
		rc.t.Fatalf("server sent %v %q", typ, b)
	}
	return m, nil
}

// reply is what a request got: its tokens in order, then its outcome.
type reply struct {
	tokens []string
	done   *wireMsg
	err    *errorDetail
}

func (r *reply) text() string { return strings.Join(r.tokens, "") }

// collect reads until every id has its outcome, checking that tokens come in order and
// nothing follows an outcome.
func (rc *rawConn) collect(ids ...string) map[string]*reply {
	rc.t.Helper()
	out := make(map[string]*reply, len(ids))
	for _, id := range ids {
		out[id] = &reply{}
	}
	pending := len(ids)
	for pending > 0 {
		m, err := rc.read()
		if err != nil {
			rc.t.Fatalf("connection ended with %d requests pending: %v", pending, err)
		}
		r := out[m.ID]
		if r == nil {
			if m.Type == "pong" {
				continue
			}
			rc.t.Fatalf("message for unknown id: %+v", m)
		}
		if r.done != nil || r.err != nil {
			rc.t.Fatalf("message after the outcome of %s: %+v", m.ID, m)
		}
		switch m.Type {
		case "token":
			if m.Index != len(r.tokens) {
				rc.t.Fatalf("%s: token %d, want %d", m.ID, m.Index, len(r.tokens))
			}
			r.tokens = append(r.tokens, m.Text)
		case "done":
			r.done = &m
			pending--
		case "error":
			if m.Error == nil {
				rc.t.Fatalf("error message without error: %+v", m)
			}
			r.err = m.Error
			pending--
		default:
			rc.t.Fatalf("unexpected message %+v", m)
		}
	}
	return out
}

// closeStatus reads until the connection ends and returns its close code.
func (rc *rawConn) closeStatus() websocket.StatusCode {
	rc.t.Helper()
	for {
		_, err := rc.read()
		if err != nil {
			return websocket.CloseStatus(err)
		}
	}
}

func chatBody(seed int64, maxTokens int) map[string]any {
	return map[string]any{
		"model":       "synth-tiny",
		"messages":    []map[string]string{{"role": "user", "content": "hello mesh"}},
		"max_tokens":  maxTokens,
		"temperature": 0.8,
		"seed":        seed,
	}
}

// restStream sends body over POST /v1/chat/completions, streamed, and returns its tokens
// and its final chunk's finish reason and usage.
func (f *wsFixture) restStream(t *testing.T, body map[string]any) (tokens []string, finish string, usage json.RawMessage) {
	t.Helper()
	b := map[string]any{"stream": true, "stream_options": map[string]bool{"include_usage": true}}
	for k, v := range body {
		b[k] = v
	}
	enc, _ := json.Marshal(b)
	req, _ := http.NewRequest(http.MethodPost, f.base+"/v1/chat/completions", bytes.NewReader(enc))
	req.Header.Set("Authorization", "Bearer "+f.key)
	resp, err := f.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("REST: status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c sseChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("REST event %q: %v", data, err)
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != "" {
				tokens = append(tokens, ch.Delta.Content)
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
		if len(c.Usage) > 0 {
			usage = c.Usage
		}
	}
	return tokens, finish, usage
}

// Over WebSocket a request gets the same tokens, finish reason and usage as over REST, and
// requests on one connection run concurrently without mixing.
func TestWSStreamsLikeREST(t *testing.T) {
	f := startWS(t, newWSDispatcher(t))
	rc := f.mustDial(t)
	const n = 8
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("r%d", i)
		rc.request(ids[i], "", chatBody(int64(i), 16+i), nil)
	}
	got := rc.collect(ids...)
	for i, id := range ids {
		want, finish, usage := f.restStream(t, chatBody(int64(i), 16+i))
		r := got[id]
		if r.err != nil {
			t.Fatalf("%s: error %+v", id, r.err)
		}
		if r.text() != strings.Join(want, "") || len(r.tokens) != len(want) {
			t.Fatalf("%s: WebSocket %q (%d tokens), REST %q (%d)", id, r.text(), len(r.tokens), strings.Join(want, ""), len(want))
		}
		if r.done.FinishReason != finish || !bytes.Equal(r.done.Usage, usage) {
			t.Fatalf("%s: done %s %s, REST %s %s", id, r.done.FinishReason, r.done.Usage, finish, usage)
		}
		var mi struct {
			Route, Tier string
			Attempts    int
		}
		if json.Unmarshal(r.done.Meshinfer, &mi) != nil || mi.Route != "local" || mi.Tier != "local" || mi.Attempts != 1 {
			t.Fatalf("%s: meshinfer %s", id, r.done.Meshinfer)
		}
	}
}

// A request the API refuses gets an error for its id; another request on the same
// connection completes, and the connection stays usable.
func TestWSBadRequestIsItsOwn(t *testing.T) {
	f := startWS(t, newWSDispatcher(t))
	rc := f.mustDial(t)
	unknownModel := chatBody(1, 4)
	unknownModel["model"] = "no-such-model"
	bad := map[string]struct {
		body    any
		headers map[string]string
		code    string
	}{
		"not-object":    {body: []int{1}, code: "invalid_request"},
		"null-body":     {body: nil, code: "invalid_request"},
		"bad-messages":  {body: map[string]any{"model": "synth-tiny", "messages": "hi"}, code: "invalid_request"},
		"too-many-tok":  {body: chatBody(1, 1<<20), code: "invalid_request"},
		"unknown-model": {body: unknownModel, code: "model_not_found"},
		"bad-privacy":   {body: chatBody(1, 4), headers: map[string]string{"X-Meshinfer-Privacy": "nowhere"}, code: "invalid_request"},
		"origin-header": {body: chatBody(1, 4), headers: map[string]string{"Origin": "http://evil.example"}, code: "invalid_request"},
		"device-header": {body: chatBody(1, 4), headers: map[string]string{"x-meshinfer-device": "other"}, code: "invalid_request"},
	}
	ids := []string{"good"}
	rc.request("good", "", chatBody(3, 12), nil)
	for id, b := range bad {
		rc.request(id, "", b.body, b.headers)
		ids = append(ids, id)
	}
	got := rc.collect(ids...)
	if got["good"].done == nil || len(got["good"].tokens) == 0 {
		t.Fatalf("good request: %+v", got["good"])
	}
	for id, b := range bad {
		r := got[id]
		if r.err == nil || r.err.Code != b.code || r.err.Message == "" || len(r.tokens) != 0 {
			t.Errorf("%s: tokens %q error %+v, want code %s", id, r.tokens, r.err, b.code)
		}
	}
	// Still usable.
	rc.request("again", "", chatBody(3, 12), nil)
	if r := rc.collect("again")["again"]; r.text() != got["good"].text() {
		t.Fatalf("after the refusals: %q, want %q", r.text(), got["good"].text())
	}
}

// A message that breaks the protocol closes the connection with its code.
func TestWSCloseCodes(t *testing.T) {
	g := newGate()
	d := newWSDispatcher(t)
	d.hold = g.hold
	f := startWS(t, d)
	defer close(g.open)
	big := append([]byte(`{"type":"ping","ts":1,"pad":"`), bytes.Repeat([]byte("x"), MaxMessageBytes)...)
	big = append(big, `"}`...)
	tests := []struct {
		name   string
		typ    websocket.MessageType
		before []string // sent first, each must be accepted
		msg    string
		want   websocket.StatusCode
	}{
		{name: "oversized", typ: websocket.MessageText, msg: string(big), want: websocket.StatusMessageTooBig},
		{name: "not JSON", typ: websocket.MessageText, msg: "hello", want: websocket.StatusInvalidFramePayloadData},
		{name: "JSON array", typ: websocket.MessageText, msg: "[1,2]", want: websocket.StatusInvalidFramePayloadData},
		{name: "unknown type", typ: websocket.MessageText, msg: `{"type":"subscribe","id":"a"}`, want: websocket.StatusInvalidFramePayloadData},
		{name: "no id", typ: websocket.MessageText, msg: `{"type":"request","body":{}}`, want: websocket.StatusInvalidFramePayloadData},
		{name: "long id", typ: websocket.MessageText, msg: `{"type":"cancel","id":"` + strings.Repeat("i", MaxRequestID+1) + `"}`, want: websocket.StatusInvalidFramePayloadData},
		{name: "long idempotency key", typ: websocket.MessageText,
			msg: `{"type":"request","id":"a","idempotency_key":"` + strings.Repeat("k", MaxIdempotencyKey+1) + `","body":{}}`, want: websocket.StatusInvalidFramePayloadData},
		{name: "ping without ts", typ: websocket.MessageText, msg: `{"type":"ping"}`, want: websocket.StatusInvalidFramePayloadData},
		{name: "headers not strings", typ: websocket.MessageText, msg: `{"type":"request","id":"a","body":{},"headers":{"X-Meshinfer-Privacy":1}}`, want: websocket.StatusInvalidFramePayloadData},
		{name: "binary", typ: websocket.MessageBinary, msg: `{"type":"ping","ts":1}`, want: websocket.StatusUnsupportedData},
		{name: "duplicate id", typ: websocket.MessageText, before: []string{`{"type":"request","id":"a","body":{"model":"synth-tiny","messages":[{"role":"user","content":"x"}]}}`},
			msg: `{"type":"request","id":"a","body":{"model":"synth-tiny","messages":[{"role":"user","content":"x"}]}}`, want: websocket.StatusPolicyViolation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := f.mustDial(t)
			for _, m := range tt.before {
				if err := rc.sendRaw(websocket.MessageText, []byte(m)); err != nil {
					t.Fatal(err)
				}
				<-g.started // the request is in flight
			}
			rc.sendRaw(tt.typ, []byte(tt.msg)) // may fail once the server closed
			if got := rc.closeStatus(); got != tt.want {
				t.Fatalf("closed with %v, want %v", got, tt.want)
			}
			t.Logf("figure F9: WebSocket, %s: closed with %v", tt.name, tt.want)
		})
	}
}

// A missing, unknown or revoked key gets 401 and no upgrade.
func TestWSRefusesBadKeys(t *testing.T) {
	f := startWS(t, newWSDispatcher(t))
	revoked, _ := createKey(t, f.ks, "bob")
	if _, err := f.ks.Revoke("bob", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]http.Header{
		"missing":   {},
		"unknown":   {"Authorization": {"Bearer " + KeyPrefix + strings.Repeat("a", KeyLen-len(KeyPrefix))}},
		"malformed": {"Authorization": {"Bearer sk-123"}},
		"revoked":   {"Authorization": {"Bearer " + revoked}},
	} {
		_, resp, err := f.dial(t, h)
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s key: response %v, error %v", name, resp, err)
		}
		var e wireError
		if json.NewDecoder(resp.Body).Decode(&e) != nil || e.Error == nil || e.Error.Code != "invalid_api_key" {
			t.Fatalf("%s key: body is not an invalid_api_key error", name)
		}
	}
	if f.d.calls.Load() != 0 {
		t.Fatal("a refused connection reached the dispatcher")
	}
}

// A key revoked while its connection is open is refused from the connection's next
// request: the connection is closed with 1008, and a new one gets 401.
func TestWSRevokedKeyClosesConnection(t *testing.T) {
	f := startWS(t, newWSDispatcher(t))
	rc := f.mustDial(t)
	rc.request("a", "", chatBody(1, 4), nil)
	if r := rc.collect("a")["a"]; r.done == nil {
		t.Fatalf("before revocation: %+v", r.err)
	}
	if _, err := f.ks.Revoke("alice", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	rc.send(map[string]any{"type": "ping", "ts": 1}) // pings do not check the key
	if m, err := rc.read(); err != nil || m.Type != "pong" {
		t.Fatalf("ping after revocation: %+v, %v", m, err)
	}
	rc.request("b", "", chatBody(1, 4), nil)
	if got := rc.closeStatus(); got != websocket.StatusPolicyViolation {
		t.Fatalf("request after revocation: closed with %v, want policy violation", got)
	}
	if _, resp, err := f.dial(t, nil); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("upgrade after revocation: %v, %v", resp, err)
	}
	if n := f.d.calls.Load(); n != 1 {
		t.Fatalf("%d requests ran, want 1", n)
	}
}

// Pings are answered with their ts; a silent connection is closed after the idle timeout.
func TestWSPingAndIdle(t *testing.T) {
	f := startWS(t, newWSDispatcher(t), WithIdleTimeout(300*time.Millisecond))
	rc := f.mustDial(t)
	for _, ts := range []int64{42, -1, 1 << 60} {
		rc.send(map[string]any{"type": "ping", "ts": ts})
		m, err := rc.read()
		if err != nil || m.Type != "pong" || m.TS != ts {
			t.Fatalf("ping %d: %+v, %v", ts, m, err)
		}
	}
	start := time.Now()
	if _, err := rc.read(); err == nil {
		t.Fatal("a silent connection got a message")
	}
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Fatalf("closed after %v of silence, before the idle timeout", took)
	}
}

// More than MaxInFlight requests on one connection: the excess is refused with overloaded at
// once, and the admitted ones complete.
func TestWSOverloaded(t *testing.T) {
	g := newGate()
	d := newWSDispatcher(t)
	d.hold = g.hold
	f := startWS(t, d)
	rc := f.mustDial(t)
	ids := make([]string, MaxInFlight)
	for i := range MaxInFlight {
		ids[i] = fmt.Sprint("r", i)
		rc.request(ids[i], "", chatBody(int64(i), 4), nil)
	}
	for range MaxInFlight {
		<-g.started
	}
	rc.request("excess", "", chatBody(99, 4), nil)
	if r := rc.collect("excess")["excess"]; r.err == nil || r.err.Code != "overloaded" {
		t.Fatalf("excess request: %+v", r)
	}
	close(g.open)
	for id, r := range rc.collect(ids...) {
		if r.done == nil {
			t.Fatalf("%s: %+v", id, r.err)
		}
	}
}

// A completed request resubmitted with its idempotency key, on another connection of the
// same session, is replayed and not run again; another device's session runs its own.
func TestWSIdempotentReplay(t *testing.T) {
	f := startWS(t, newWSDispatcher(t))
	rc := f.mustDial(t)
	rc.request("a", "key-1", chatBody(5, 20), nil)
	first := rc.collect("a")["a"]
	if first.done == nil {
		t.Fatalf("first: %+v", first.err)
	}
	rc2 := f.mustDial(t)
	rc2.request("b", "key-1", chatBody(5, 20), nil)
	again := rc2.collect("b")["b"]
	if again.done == nil || again.text() != first.text() || !bytes.Equal(again.done.Usage, first.done.Usage) {
		t.Fatalf("replay %+v, want %+v", again, first)
	}
	if n := f.d.calls.Load(); n != 1 {
		t.Fatalf("the dispatcher served %d requests, want 1", n)
	}
	rc2.request("c", "key-1", chatBody(6, 20), nil) // the same key for another request
	if r := rc2.collect("c")["c"]; r.err == nil || r.err.Code != "invalid_request" || !strings.Contains(r.err.Message, "idempotency_key") {
		t.Fatalf("a reused key: %+v", r)
	}
	rc2.request("d", "key-1", chatBody(5, 20), map[string]string{"X-Meshinfer-Priority": "cost"})
	if r := rc2.collect("d")["d"]; r.err == nil || r.err.Code != "invalid_request" || f.d.calls.Load() != 1 {
		t.Fatalf("a reused key with other headers: %+v", r)
	}
	other, _, err := f.dial(t, http.Header{"Authorization": {"Bearer " + f.key}, DeviceHeader: {"phone"}})
	if err != nil {
		t.Fatal(err)
	}
	other.request("a", "key-1", chatBody(5, 20), nil)
	if r := other.collect("a")["a"]; r.done == nil || f.d.calls.Load() != 2 {
		t.Fatalf("another device: %+v, %d served", r, f.d.calls.Load())
	}
}

// A request whose connection was cut keeps running; resubmitted on a new connection it is
// attached to, replayed from index 0 and completed, having run once.
func TestWSResubmissionAttaches(t *testing.T) {
	g := newGate()
	d := newWSDispatcher(t)
	d.hold = g.hold
	f := startWS(t, d)
	rc := f.mustDial(t)
	rc.request("a", "idem", chatBody(9, 24), nil)
	<-g.started
	rc.c.CloseNow() // cut
	rc2 := f.mustDial(t)
	rc2.request("a2", "idem", chatBody(9, 24), nil)
	close(g.open)
	r := rc2.collect("a2")["a2"]
	want, _, _ := f.restStream(t, chatBody(9, 24))
	if r.done == nil || r.text() != strings.Join(want, "") {
		t.Fatalf("attached: %+v, want %q", r, strings.Join(want, ""))
	}
	if n := d.calls.Load(); n != 2 { // the attached run and the REST reference
		t.Fatalf("the dispatcher served %d requests, want 2", n)
	}
}

// A request whose connection died and that nobody resubmits is cancelled after the grace;
// one without an idempotency key at once; a cancel message cancels at once too.
func TestWSAbandonedAndCancelledRuns(t *testing.T) {
	g := newGate()
	d := newWSDispatcher(t)
	d.hold = g.hold
	f := startWS(t, d, WithDetachGrace(50*time.Millisecond))
	defer close(g.open)

	rc := f.mustDial(t)
	rc.request("a", "idem", chatBody(1, 4), nil)
	<-g.started
	rc.c.CloseNow()
	if cause := <-g.ended; !errors.Is(cause, errAbandoned) {
		t.Fatalf("abandoned run ended with %v", cause)
	}

	rc = f.mustDial(t)
	rc.request("b", "", chatBody(1, 4), nil)
	<-g.started
	rc.c.CloseNow()
	if cause := <-g.ended; !errors.Is(cause, errCancelled) {
		t.Fatalf("run without idempotency key ended with %v", cause)
	}

	rc = f.mustDial(t)
	rc.request("c", "idem-c", chatBody(1, 4), nil)
	<-g.started
	rc.send(map[string]any{"type": "cancel", "id": "c"})
	if r := rc.collect("c")["c"]; r.err == nil || r.err.Code != "unavailable" || !strings.Contains(r.err.Message, "cancelled") {
		t.Fatalf("cancelled request: %+v", r)
	}
	if cause := <-g.ended; !errors.Is(cause, errCancelled) {
		t.Fatalf("cancelled run ended with %v", cause)
	}
	// The id is free again, and a cancelled run is not attached to: this one runs afresh.
	rc.request("c", "idem-c", chatBody(1, 4), nil)
	<-g.started
	rc.send(map[string]any{"type": "cancel", "id": "c"})
	rc.collect("c")
	<-g.ended
}

// Close ends every connection with 1001 and every run with shutting_down, and returns once
// every goroutine of the endpoint has ended.
func TestWSClose(t *testing.T) {
	g := newGate()
	d := newWSDispatcher(t)
	d.hold = g.hold
	defer close(g.open)
	f := startWS(t, d)
	rc := f.mustDial(t)
	rc.request("a", "idem", chatBody(1, 4), nil)
	<-g.started
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := f.ws.Close(); err != nil {
			t.Error(err)
		}
	})
	status := rc.closeStatus()
	wg.Wait()
	if status != websocket.StatusGoingAway {
		t.Fatalf("closed with %v, want going away", status)
	}
	if cause := <-g.ended; !errors.Is(cause, errShuttingDown) {
		t.Fatalf("run ended with %v", cause)
	}
	if _, resp, err := f.dial(t, nil); err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("upgrade after Close: %v, %v", resp, err)
	}
}

// The idempotency cache keeps at most its bounds, oldest out first.
func TestResultCacheBounds(t *testing.T) {
	done := func(tokens ...string) *run {
		r := &run{changed: make(chan struct{})}
		for _, tok := range tokens {
			r.token(tok)
		}
		r.finish(outcome{done: true, finish: "stop"})
		return r
	}
	c := newResultCache(3, 1000, time.Minute)
	for i := range 5 {
		c.put(fmt.Sprint(i), done("x"), t0)
	}
	for i, want := range []bool{false, false, true, true, true} {
		if got := c.get(fmt.Sprint(i), t0) != nil; got != want {
			t.Errorf("entry %d cached %v, want %v", i, got, want)
		}
	}
	if c.get("4", t0.Add(time.Minute+time.Second)) != nil || c.order.Len() != 0 || c.bytes != 0 {
		t.Errorf("after the TTL: %d entries, %d bytes", c.order.Len(), c.bytes)
	}
	c = newResultCache(10, 100, time.Minute)
	c.put("big", done(strings.Repeat("y", 200)), t0)
	c.put("a", done(strings.Repeat("y", 40)), t0)
	c.put("b", done(strings.Repeat("y", 40)), t0)
	if c.get("big", t0) != nil || c.get("a", t0) != nil || c.get("b", t0) == nil || c.bytes > 100 {
		t.Errorf("byte budget: big %v a %v b %v, %d bytes", c.get("big", t0) != nil, c.get("a", t0) != nil, c.get("b", t0) != nil, c.bytes)
	}
}

// A browser offers its key as a subprotocol next to Subprotocol: the connection is
// authenticated, the gateway selects Subprotocol (never echoing the key), and requests run.
// A bad key offered that way is refused like a bad header.
func TestWSKeyAsSubprotocol(t *testing.T) {
	f := startWS(t, newWSDispatcher(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, f.base+WebSocketPath, &websocket.DialOptions{HTTPClient: f.hc,
		Subprotocols: []string{Subprotocol, f.key}})
	if err != nil {
		t.Fatalf("dial with the key as a subprotocol: %v", err)
	}
	defer c.CloseNow()
	if got := resp.Header.Get("Sec-WebSocket-Protocol"); got != Subprotocol || c.Subprotocol() != Subprotocol {
		t.Fatalf("selected subprotocol %q (%q), want %q", got, c.Subprotocol(), Subprotocol)
	}
	c.SetReadLimit(MaxMessageBytes)
	rc := &rawConn{t: t, c: c}
	rc.request("r1", "idem-1", chatBody(3, 5), nil)
	if r := rc.collect("r1")["r1"]; r.err != nil || r.done == nil || len(r.tokens) == 0 {
		t.Fatalf("request over a subprotocol-authenticated connection: %+v", r)
	}

	for name, protos := range map[string][]string{
		"unknown key": {Subprotocol, KeyPrefix + strings.Repeat("a", KeyLen-len(KeyPrefix))},
		"two keys":    {Subprotocol, f.key, KeyPrefix + strings.Repeat("b", KeyLen-len(KeyPrefix))},
	} {
		_, resp, err := websocket.Dial(ctx, f.base+WebSocketPath, &websocket.DialOptions{HTTPClient: f.hc, Subprotocols: protos})
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s: response %v, error %v", name, resp, err)
		}
	}
}

// X-Meshinfer-Timeout passes through a request message's headers: a request held past its
// limit ends with timeout for its id, the API's own time limit, and a limit out of bounds is
// refused like any bad preference.
func TestWSTimeoutHeader(t *testing.T) {
	g := newGate()
	d := newWSDispatcher(t)
	d.hold = g.hold
	f := startWS(t, d)
	defer close(g.open)
	rc := f.mustDial(t)
	rc.request("slow", "", chatBody(1, 4), map[string]string{"X-Meshinfer-Timeout": "50ms"})
	rc.request("bad", "", chatBody(1, 4), map[string]string{"X-Meshinfer-Timeout": "2h"})
	got := rc.collect("slow", "bad")
	if r := got["slow"]; r.err == nil || r.err.Code != "timeout" || !strings.Contains(r.err.Message, "50ms time limit") || len(r.tokens) != 0 {
		t.Errorf("held past its limit: tokens %q error %+v, want timeout naming the 50ms limit", r.tokens, r.err)
	}
	if r := got["bad"]; r.err == nil || r.err.Code != "invalid_request" || !strings.Contains(r.err.Message, "X-Meshinfer-Timeout header") {
		t.Errorf("a 2h limit: error %+v, want invalid_request naming the header", r.err)
	}
	// The hold sent its context's cause before returning, so before the error was written.
	select {
	case err := <-g.ended:
		if inference.CodeOf(err) != inference.CodeTimeout {
			t.Errorf("the held request's context ended with %v, want the timeout cause", err)
		}
	default:
		t.Errorf("the held request's context did not end")
	}
}
