package gateway

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/meshinfer/meshinfer/transport/openai"
)

func TestCheckOriginPatterns(t *testing.T) {
	for _, ok := range [][]string{nil, {"app.example.com"}, {"*.example.com", "localhost:5173", "https://app.example.com"},
		{"*.com"}, {"https://*.example.com"}, {"localhost:*"}} {
		if err := CheckOriginPatterns(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	// "*.*", "https://*", "*:*" and the like match any web page's origin (issue 19).
	for _, bad := range [][]string{{"*"}, {""}, {"[bad"}, {"*.*"}, {"https://*"}, {"*:*"}, {"http*://*"}, {"*.*.*"}, {"app.example.com", "*.*"}} {
		if err := CheckOriginPatterns(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A page on an allowed origin can upgrade to the WebSocket and call the REST API (a
// preflight answered without a key, responses readable by that origin only); a page on
// another origin cannot.
func TestBrowserOrigins(t *testing.T) {
	ks := openKeys(t, t.TempDir())
	key, _ := createKey(t, ks, "app")
	d := newWSDispatcher(t)
	api := openai.Handler(d)
	allowed := []string{"*.example.com"}
	ws, err := NewWebSocket(ks, api, WithOriginPatterns(allowed))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	mux := http.NewServeMux()
	mux.Handle(WebSocketPath, ws)
	mux.Handle("/", api)
	srv := httptest.NewServer(CORS(allowed, RequireKey(ks, mux)))
	defer srv.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}

	dial := func(origin string) (*http.Response, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, srv.URL+WebSocketPath, &websocket.DialOptions{HTTPClient: hc,
			HTTPHeader: http.Header{"Origin": {origin}}, Subprotocols: []string{Subprotocol, key}})
		if err == nil {
			c.CloseNow()
		}
		return resp, err
	}
	if _, err := dial("https://app.example.com"); err != nil {
		t.Fatalf("allowed origin: %v", err)
	}
	if resp, err := dial("https://evil.test"); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("other origin: %v, %v; want 403", resp, err)
	}

	// REST: the preflight, then the call.
	pre, _ := http.NewRequest(http.MethodOptions, srv.URL+"/v1/chat/completions", nil)
	pre.Header.Set("Origin", "https://app.example.com")
	pre.Header.Set("Access-Control-Request-Method", "POST")
	pre.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
	resp, err := hc.Do(pre)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Fatalf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
	call := func(origin string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"synth-tiny","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Origin", origin)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if r := call("https://app.example.com"); r.StatusCode != http.StatusOK || r.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" ||
		!strings.Contains(r.Header.Get("Access-Control-Expose-Headers"), "X-Meshinfer-Route") {
		t.Fatalf("allowed origin's call: %d %v", r.StatusCode, r.Header)
	}
	if r := call("https://evil.test"); r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("other origin's call readable: %v", r.Header)
	}
	// A preflight from another origin reaches RequireKey, which refuses it: no key.
	pre.Header.Set("Origin", "https://evil.test")
	if resp, err = hc.Do(pre); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("other origin's preflight: %d %v", resp.StatusCode, resp.Header)
	}
}

// An API key goes over plain http:// only to this machine (issue 19).
func TestCheckKeyTransport(t *testing.T) {
	for url, refused := range map[string]bool{
		"https://coord.example:9337":  false,
		"http://127.0.0.1:9337":       false,
		"http://127.8.0.1:9337":       false,
		"http://localhost:9337/":      false,
		"http://[::1]:9337":           false,
		"http://coord.example:9337":   true,
		"http://192.168.1.20:9337":    true,
		"HTTP://coord.example":        true,
		"http://localhost.evil.test/": true,
	} {
		if err := CheckKeyTransport(url); (err != nil) != refused || (err != nil && !errors.Is(err, ErrPlainHTTPKey)) {
			t.Errorf("%s: %v, want refused %v", url, err, refused)
		}
	}
}
