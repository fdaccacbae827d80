package console

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/meshinfer/meshinfer/transport"
)

// Canaries the fuzzed requests carry in their body and in a header of their own: the
// console must never send them back.
const (
	bodyCanary   = "zq7-body-canary"
	headerCanary = "zq7-header-canary"
)

// FuzzStatusQuery (Z12): any request line (method, path, query), Host and extra header
// reaches the console's handler (as New serves it on loopback) without a panic, and gets a
// status of the closed set the routes allow. The answer never echoes the request's body or
// headers: a 200 or a 503 is byte for byte the answer to a plain GET of the same path (the
// console reads nothing of a request but its method and path), and an error echoes at most
// the Host it refuses.
func FuzzStatusQuery(f *testing.F) {
	for _, s := range [][4]string{
		{"GET", "/api/status", "127.0.0.1:3131", ""},
		{"GET", "/api/status?verbose=1&peer=%3Cscript%3E", "localhost", "Accept: text/html"},
		{"GET", "/api/peers?limit=-1&limit=99999999999999999999", "[::1]:3131", "X-Forwarded-For: 10.0.0.1"},
		{"HEAD", "/health", "127.0.0.1", ""},
		{"GET", "/health/ready?" + strings.Repeat("a=1&", 64), "127.0.0.1", "Cookie: a=b"},
		{"POST", "/api/status", "127.0.0.1", "Content-Type: application/json"},
		{"GET", "/api//status?q=1", "127.0.0.1", ""},
		{"GET", "/api/%73tatus", "127.0.0.1", ""},
		{"GET", "/../api/peers", "127.0.0.1", ""},
		{"GET", "http://evil.example/api/status", "evil.example", ""},
		{"OPTIONS", "*", "127.0.0.1", ""},
		{"GET", "/api/status#frag", "127.0.0.1", "Range: bytes=0-1"},
	} {
		f.Add(s[0], s[1], s[2], s[3], `{"prompt":"secret"}`)
	}
	src := &fakeSource{status: testStatus(), peers: []Peer{{PeerID: "12D3KooWPeer", Capability: testVector("12D3KooWPeer")}}}
	src.ready.Store(true)
	h := transport.LoopbackHosts(Handler(src))
	plain := map[string]*httptest.ResponseRecorder{}
	for _, p := range []string{"/api/status", "/api/peers", "/health", "/health/ready"} {
		plain[p] = httptest.NewRecorder()
		h.ServeHTTP(plain[p], httptest.NewRequest(http.MethodGet, "http://127.0.0.1"+p, nil))
		if plain[p].Code != http.StatusOK {
			f.Fatalf("GET %s: %d", p, plain[p].Code)
		}
	}
	f.Fuzz(func(t *testing.T, method, target, host, header, body string) {
		if strings.Contains(method+target+host, "zq7-") {
			return // a redirect may echo the path and query, a 421 the Host: canaries are elsewhere
		}
		body = bodyCanary + body
		raw := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nX-Fuzz: %s\r\n%s\r\nContent-Length: %d\r\n\r\n%s",
			method, target, host, headerCanary, header, len(body), body)
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return // net/http answers 400 before any handler runs
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		out := w.Body.String() + fmt.Sprint(w.Header())
		if strings.Contains(out, bodyCanary) || strings.Contains(out, headerCanary) {
			t.Fatalf("%q: the answer echoes the request: %d %q", raw, w.Code, out)
		}
		switch w.Code {
		case http.StatusOK, http.StatusServiceUnavailable:
			want := plain[r.URL.Path]
			if want == nil || w.Code != want.Code || !bytes.Equal(w.Body.Bytes(), want.Body.Bytes()) ||
				w.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("%q: %d, not the plain answer for %q", raw, w.Code, r.URL.Path)
			}
		case http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect,
			http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusMisdirectedRequest, http.StatusBadRequest:
		default:
			t.Fatalf("%q: status %d", raw, w.Code)
		}
	})
}
