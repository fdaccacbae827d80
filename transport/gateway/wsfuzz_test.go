package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"testing"
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
