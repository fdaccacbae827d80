package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// FuzzDecodeClientMessage: decoding never panics; a message it accepts has a known type and
// an envelope in bounds, and encodes and decodes again to the same message.
func FuzzDecodeClientMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"request","id":"r1","idempotency_key":"k","body":{"model":"synth-tiny","messages":[]},"headers":{"X-Meshinfer-Privacy":"mesh"}}`,
		`{"type":"request","id":"r1","body":null}`,
		`{"type":"cancel","id":"r1"}`,
		`{"type":"ping","ts":17}`,
		`{"type":"ping","ts":1.5}`,
		`{"type":"pong","ts":1}`,
		`{"type":"request","id":"","body":{}}`,
		`{"type":"request","id":"a","headers":{"a":1}}`,
		`{"type":"cancel","id":"a","extra":[1,2,{"x":null}]}`,
		`[]`, `null`, `"request"`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeClientMessage(data)
		if err != nil {
			return
		}
		switch m.Type {
		case msgRequest, msgCancel:
			if m.ID == "" || len(m.ID) > MaxRequestID || len(m.IdempotencyKey) > MaxIdempotencyKey {
				t.Fatalf("accepted %q: envelope out of bounds", data)
			}
		case msgPing:
			if m.TS == nil {
				t.Fatalf("accepted %q: ping without ts", data)
			}
		default:
			t.Fatalf("accepted %q: type %q", data, m.Type)
		}
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", data, err)
		}
		back, err := decodeClientMessage(again)
		if err != nil {
			t.Fatalf("our own encoding %q of %q is refused: %v", again, data, err)
		}
		var b1, b2 bytes.Buffer
		json.Compact(&b1, m.Body)
		json.Compact(&b2, back.Body)
		if back.Type != m.Type || back.ID != m.ID || back.IdempotencyKey != m.IdempotencyKey ||
			(back.TS == nil) != (m.TS == nil) || (m.TS != nil && *back.TS != *m.TS) ||
			!maps.Equal(back.Headers, m.Headers) || !bytes.Equal(b1.Bytes(), b2.Bytes()) {
			t.Fatalf("%q decodes to %+v, its encoding %q to %+v", data, m, again, back)
		}
	})
}

// FuzzEventWriter: whatever the API writes, and however it is split into writes, the run
// ends with exactly one outcome and never panics.
func FuzzEventWriter(f *testing.F) {
	stream := "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"He\"},\"finish_reason\":null}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"meshinfer\":{\"route\":\"local\",\"tier\":\"local\",\"attempts\":1}}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}\n\n" +
		"data: [DONE]\n\n"
	f.Add(200, []byte(stream), 7)
	f.Add(200, []byte("data: {\"error\":{\"message\":\"gone\",\"type\":\"server_error\",\"param\":null,\"code\":\"peer_lost\"}}\n\n"), 3)
	f.Add(503, []byte(`{"error":{"message":"no","type":"server_error","param":null,"code":"no_peer"}}`), 0)
	f.Add(200, []byte("data: [DONE]\n\n"), 1)
	f.Add(200, []byte("data: {nope\n\n"), 2)
	f.Add(0, []byte{}, 0)
	f.Fuzz(func(t *testing.T, status int, body []byte, split int) {
		r := &run{changed: make(chan struct{}), watchers: 1}
		w := &eventWriter{r: r, header: make(http.Header)}
		if status < 100 || status > 999 {
			status = 0 // not a status: the first Write implies 200
		}
		if status != 0 {
			w.WriteHeader(status)
		}
		if split < 0 {
			split = -split
		}
		for len(body) > 0 {
			n := len(body)
			if split > 0 {
				n = min(n, split)
			}
			w.Write(body[:n])
			body = body[n:]
		}
		w.end(context.Background())
		toks, fin, _ := r.since(0)
		if fin == nil {
			t.Fatal("no outcome")
		}
		if !fin.done && fin.code == "" {
			t.Fatalf("an error outcome without a code: %+v", fin)
		}
		if status != 0 && status != 200 && (fin.done || len(toks) > 0) {
			t.Fatalf("status %d made tokens %q and outcome %+v", status, toks, fin)
		}
		var out bytes.Buffer
		out.Write(fin.encode("id"))
		if !json.Valid(out.Bytes()) {
			t.Fatalf("outcome encodes to invalid JSON %q", out.Bytes())
		}
	})
}

// scriptConn is a hijacked connection whose client sends in, then closes its side (EOF),
// after waiting, if until is set, for the server to write until or a close frame, or to
// close the connection. What the server writes is kept.
type scriptConn struct {
	in    *bytes.Reader
	until []byte

	mu     sync.Mutex
	out    bytes.Buffer
	closed bool
	done   chan struct{} // closed once until was written or the connection closed
	once   sync.Once
}

func newScriptConn(in, until []byte) *scriptConn {
	return &scriptConn{in: bytes.NewReader(in), until: until, done: make(chan struct{})}
}

func (c *scriptConn) Read(p []byte) (int, error) {
	if n, _ := c.in.Read(p); n > 0 {
		return n, nil
	}
	if c.until != nil {
		<-c.done
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	return 0, io.EOF
}

func (c *scriptConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	c.out.Write(p)
	if bytes.Contains(c.out.Bytes(), c.until) || closing(c.out.Bytes()) {
		c.once.Do(func() { close(c.done) })
	}
	return len(p), nil
}

// closing reports whether the server frames in b include a close frame: the client's EOF
// then ends the close handshake at once.
func closing(b []byte) bool {
	frames, _ := parseServerFrames(b)
	return slices.ContainsFunc(frames, func(f serverFrame) bool { return f.op == opClose })
}

func (c *scriptConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.once.Do(func() { close(c.done) })
	return nil
}

func (c *scriptConn) LocalAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9337}
}
func (c *scriptConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
}
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// hijackWriter is the ResponseWriter of an upgrade request whose connection is conn.
type hijackWriter struct {
	header http.Header
	code   int
	conn   net.Conn
}

func (w *hijackWriter) Header() http.Header         { return w.header }
func (w *hijackWriter) WriteHeader(code int)        { w.code = code }
func (w *hijackWriter) Write(b []byte) (int, error) { return len(b), nil }

func (w *hijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return w.conn, bufio.NewReadWriter(bufio.NewReader(w.conn), bufio.NewWriter(w.conn)), nil
}

// gatewayCloseCodes are the close codes the gateway or its WebSocket library send of their
// own accord (doc.go): besides these, a close frame may only echo the client's own.
var gatewayCloseCodes = []websocket.StatusCode{
	websocket.StatusProtocolError, websocket.StatusUnsupportedData, websocket.StatusInvalidFramePayloadData,
	websocket.StatusPolicyViolation, websocket.StatusMessageTooBig, websocket.StatusGoingAway,
}

// clientCloseCodes are the codes of the close frames in b read as a client's frames, as far
// as they parse: the codes the server may echo. noStatus is set for a close frame without
// a code, which is echoed as one without a code.
func clientCloseCodes(b []byte) (codes []websocket.StatusCode, noStatus bool) {
	for len(b) >= 6 && b[1]&0x80 != 0 {
		n, hdr := uint64(b[1]&0x7f), 2
		switch n {
		case 126:
			n, hdr = uint64(binary.BigEndian.Uint16(b[2:])), 4
		case 127:
			if len(b) < 14 {
				return codes, noStatus
			}
			n, hdr = binary.BigEndian.Uint64(b[2:]), 10
		}
		if len(b) < hdr+4 || uint64(len(b)-hdr-4) < n {
			return codes, noStatus
		}
		mask, payload := b[hdr:hdr+4], slices.Clone(b[hdr+4:hdr+4+int(n)])
		for i := range payload {
			payload[i] ^= mask[i%4]
		}
		if b[0]&0x0f == opClose {
			if len(payload) >= 2 {
				codes = append(codes, websocket.StatusCode(binary.BigEndian.Uint16(payload)))
			} else {
				noStatus = true
			}
		}
		b = b[hdr+4+int(n):]
	}
	return codes, noStatus
}

// sentinel ends every script: once its pong is written, the server has answered every
// message before it (it answers in order), and the client closes its side.
var sentinel = []byte(`{"type":"ping","ts":-77031}`)

// wholeFrames reports whether b is a run of complete client frames (masked or not), so that
// a frame after it is read as a frame of its own.
func wholeFrames(b []byte) bool {
	for len(b) > 0 {
		if len(b) < 2 {
			return false
		}
		n, hdr := uint64(b[1]&0x7f), 2
		switch n {
		case 126:
			if len(b) < 4 {
				return false
			}
			n, hdr = uint64(binary.BigEndian.Uint16(b[2:])), 4
		case 127:
			if len(b) < 10 {
				return false
			}
			n, hdr = binary.BigEndian.Uint64(b[2:]), 10
		}
		if b[1]&0x80 != 0 {
			hdr += 4
		}
		if len(b) < hdr || uint64(len(b)-hdr) < n {
			return false
		}
		b = b[hdr+int(n):]
	}
	return true
}

// serveFrames upgrades a connection to the gateway (a WebSocket over api behind RequireKey
// with ks), feeds it in as the client's bytes and returns the server's frames once the
// handler returned. When in is whole frames, the sentinel ping follows, and the client's
// EOF waits for its pong (or a close frame, or the server closing): every answer to in is
// then written. Otherwise the EOF follows in at once, as the server could not tell where
// a sentinel begins.
func serveFrames(t *testing.T, ks *KeyStore, key string, api http.Handler, in []byte) []serverFrame {
	t.Helper()
	// The timeouts are a safety net: no script waits on them.
	ws, err := NewWebSocket(ks, api, WithDetachGrace(0), WithIdleTimeout(time.Second), WithMessageTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	conn := newScriptConn(in, nil)
	if wholeFrames(in) {
		conn = newScriptConn(append(slices.Clone(in), clientFrame(opText, true, sentinel, len(sentinel))...), []byte(`{"type":"pong","ts":-77031}`))
	}
	r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:9337"+WebSocketPath, nil)
	r.Header = upgradeHeader(key)
	w := &hijackWriter{header: http.Header{}, conn: conn}
	RequireKey(ks, ws).ServeHTTP(w, r)
	ws.Close()
	if w.code != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answered %d", w.code)
	}
	frames, rest := parseServerFrames(conn.out.Bytes())
	if len(rest) != 0 {
		t.Fatalf("the server wrote a broken frame: %q", rest)
	}
	return frames
}

// The fuzz target's harness sees what a client would: a pong for a ping, a close code for
// a broken message.
func TestServeFrames(t *testing.T) {
	ks := openKeys(t, t.TempDir())
	key, _ := createKey(t, ks, "alice")
	api := openai.Handler(newWSDispatcher(t))
	ping := []byte(`{"type":"ping","ts":17}`)
	big := make([]byte, MaxMessageBytes+1)
	for _, tt := range []struct {
		name string
		in   []byte
		pong bool                 // the last frame is the pong
		code websocket.StatusCode // else the close code of the last frame
	}{
		{"ping", clientFrame(opText, true, ping, len(ping)), true, 0},
		{"binary", clientFrame(opBinary, true, ping, len(ping)), false, websocket.StatusUnsupportedData},
		{"too big", clientFrame(opText, true, big, len(big)), false, websocket.StatusMessageTooBig},
		{"not JSON", clientFrame(opText, true, []byte("hi"), 2), false, websocket.StatusInvalidFramePayloadData},
	} {
		frames := serveFrames(t, ks, key, api, tt.in)
		if len(frames) == 0 {
			t.Fatalf("%s: no answer", tt.name)
		}
		last := frames[len(frames)-1]
		switch {
		case tt.pong && (len(frames) != 2 || string(frames[0].payload) != `{"type":"pong","ts":17}`):
			t.Errorf("%s: frames %+v, want the pong, then the sentinel's", tt.name, frames)
		case !tt.pong && (last.op != opClose || len(last.payload) < 2 || websocket.StatusCode(binary.BigEndian.Uint16(last.payload)) != tt.code):
			t.Errorf("%s: last frame %#x %q, want close %v", tt.name, last.op, last.payload, tt.code)
		}
	}
}

// FuzzWSFrames (Z5): raw WebSocket frames, anything a client could send after a valid
// upgrade (then the sentinel ping), into the gateway's handler behind RequireKey, with the real API handler and the
// synthetic model behind it. The handler never panics and returns once the client's bytes
// end; everything it writes is well-formed server frames: text messages that are JSON
// objects of the server's types (an error's code one of inference's), control frames within
// 125 bytes, and at most one close frame, last, whose code is one of the gateway's close
// codes or the client's own echoed.
func FuzzWSFrames(f *testing.F) {
	msg := func(v string) []byte { return clientFrame(opText, true, []byte(v), len(v)) }
	req, _ := json.Marshal(map[string]any{"type": "request", "id": "r1", "body": chatBody(1, 2)})
	closeNormal := binary.BigEndian.AppendUint16(nil, uint16(websocket.StatusNormalClosure))
	for _, seed := range [][]byte{
		msg(`{"type":"ping","ts":17}`),
		append(msg(string(req)), clientFrame(opClose, true, closeNormal, 2)...),
		append(msg(string(req)), msg(`{"type":"cancel","id":"r1"}`)...),
		msg(`{"type":"direct","id":"d1","body":{}}`),
		msg(`{"type":"signal","id":"d1","frame":"AQ=="}`),
		append(clientFrame(opText, false, []byte(`{"type":`), 8), clientFrame(opContinuation, true, []byte(`"ping","ts":1}`), 14)...),
		clientFrame(opBinary, true, []byte(`{"type":"ping","ts":1}`), 22),
		clientFrame(opPing, true, []byte("hi"), 2),
		clientFrame(opPing, true, bytes.Repeat([]byte("p"), 126), 126), // control frame over 125
		clientFrame(opPing, false, []byte("x"), 1),                     // fragmented control frame
		clientFrame(opText, true, nil, MaxMessageBytes+1),              // declares too much
		clientFrame(opContinuation, true, []byte("x"), 1),              // continuation of nothing
		clientFrame(opClose, true, []byte{0x03}, 1),                    // a close code cut short
		clientFrame(opClose, true, nil, 0),
		clientFrame(0x3, true, []byte("x"), 1), // reserved opcode
		{0x81, 0x05, 'h', 'e', 'l', 'l', 'o'},  // unmasked
		{0xc1, 0x80, 0, 0, 0, 0},               // RSV1 without compression
		msg("\xff\xfe"),
		msg(`{"type":"request","id":"` + strings.Repeat("i", MaxRequestID+1) + `","body":{}}`),
	} {
		f.Add(seed)
	}
	ks := openKeys(f, f.TempDir())
	key, _ := createKey(f, ks, "fuzz")
	api := openai.Handler(newWSDispatcher(f))
	types := []string{msgToken, msgDone, msgError, msgPong, msgSignal, msgDirectDone}
	f.Fuzz(func(t *testing.T, in []byte) {
		frames := serveFrames(t, ks, key, api, in)
		echo, noStatus := clientCloseCodes(in)
		for i, fr := range frames {
			switch {
			case fr.op == opText:
				var m struct {
					Type  string       `json:"type"`
					Error *errorDetail `json:"error"`
				}
				if !fr.fin || json.Unmarshal(fr.payload, &m) != nil || !slices.Contains(types, m.Type) {
					t.Fatalf("server message %q", fr.payload)
				}
				if m.Type == msgError && (m.Error == nil || !slices.Contains(inference.Codes(), inference.Code(m.Error.Code))) {
					t.Fatalf("error message %q: not a typed code", fr.payload)
				}
			case fr.op == opPong && fr.fin && len(fr.payload) <= 125:
			case fr.op == opClose && i == len(frames)-1:
				if len(fr.payload) == 0 {
					if !noStatus {
						t.Fatal("a close frame without a code the client did not send")
					}
					continue
				}
				code := websocket.StatusCode(binary.BigEndian.Uint16(fr.payload))
				if len(fr.payload) < 2 || len(fr.payload) > 125 ||
					!slices.Contains(gatewayCloseCodes, code) && !slices.Contains(echo, code) {
					t.Fatalf("close frame %q: code %d is neither the gateway's nor the client's", fr.payload, code)
				}
			default:
				t.Fatalf("server frame %d of %d: opcode %#x, fin %v, %d bytes", i, len(frames), fr.op, fr.fin, len(fr.payload))
			}
		}
	})
}
