package transport

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// A loopback service answers requests for this machine's names only: a page that rebinds its
// own domain to 127.0.0.1 gets 421 (issue 19).
func TestLoopbackHosts(t *testing.T) {
	h := LoopbackHosts(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	for host, want := range map[string]int{
		"127.0.0.1:9337": http.StatusOK, "localhost:3131": http.StatusOK, "LOCALHOST": http.StatusOK,
		"[::1]:9337": http.StatusOK, "127.1.2.3": http.StatusOK,
		"evil.example:9337": http.StatusMisdirectedRequest, "evil.example": http.StatusMisdirectedRequest,
		"localhost.evil.example": http.StatusMisdirectedRequest, "192.168.1.2:9337": http.StatusMisdirectedRequest,
		"": http.StatusMisdirectedRequest,
	} {
		r := httptest.NewRequest(http.MethodGet, "/api/status", nil)
		r.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("Host %q: status %d, want %d", host, w.Code, want)
		}
	}
}
