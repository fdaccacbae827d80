package gateway

import (
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strings"
)

// Browser apps on other origins.
//
// A browser page may call the gateway only from the coordinator's own origin unless the
// operator names the page's origin: each pattern is a host ("app.example.com",
// "localhost:5173") or a path.Match glob of one ("*.example.com"); a pattern with "://"
// matches scheme and host ("https://app.example.com"). The WebSocket upgrade accepts those
// origins (and refuses others with 403), and CORS lets their pages use the REST endpoints:
// a preflight (OPTIONS) is answered without a key, and responses carry
// Access-Control-Allow-Origin for the calling origin only.

// CheckOriginPatterns reports a pattern path.Match cannot parse, or a lone "*" (which would
// let every web page on the internet spend the coordinator's keys' quota from a visitor's
// browser: name the origins).
func CheckOriginPatterns(patterns []string) error {
	for _, p := range patterns {
		if p == "*" || p == "" {
			return fmt.Errorf("origin pattern %q: name the origins of your apps (app.example.com, *.example.com)", p)
		}
		if _, err := path.Match(strings.ToLower(p), ""); err != nil {
			return fmt.Errorf("origin pattern %q: %w", p, err)
		}
		if matchesAnyOrigin(p) {
			return fmt.Errorf("origin pattern %q matches the origin of any web page; name the origins of your apps (app.example.com, *.example.com)", p)
		}
	}
	return nil
}

// unrelatedOrigins are origins of pages nobody would mean to let in, on unrelated hosts: a
// pattern that matches two of them ("*.*", "https://*", "*:*") matches any origin.
var unrelatedOrigins = [...]string{"https://evil.invalid", "http://attacker.test:8443", "https://203.0.113.7",
	"http://phish.example.net:8080", "https://a.b.c.d.invalid"}

// matchesAnyOrigin reports whether pattern matches at least two unrelatedOrigins.
func matchesAnyOrigin(pattern string) bool {
	n := 0
	for _, o := range unrelatedOrigins {
		if originAllowed(o, []string{pattern}) {
			n++
		}
	}
	return n >= 2
}

// WithOriginPatterns lets browser pages on the origins the patterns match upgrade to the
// WebSocket (see CORS).
func WithOriginPatterns(patterns []string) WSOption {
	return func(g *WebSocket) { g.origins = patterns }
}

// originAllowed reports whether origin (an Origin header) matches one of patterns.
func originAllowed(origin string, patterns []string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	for _, p := range patterns {
		target := u.Host
		if strings.Contains(p, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, _ := path.Match(strings.ToLower(p), strings.ToLower(target)); ok {
			return true
		}
	}
	return false
}

// corsHeaders are the request headers a page may send, and the response headers it may
// read.
const (
	corsAllowHeaders  = "Authorization, Content-Type, " + APIKeyHeader + ", " + DeviceHeader + ", X-Meshinfer-Privacy, X-Meshinfer-Priority, X-Meshinfer-Transport, X-Meshinfer-Timeout"
	corsExposeHeaders = "X-Meshinfer-Route, X-Meshinfer-Tier, X-Meshinfer-Attempts"
)

// CORS wraps next, the coordinator's API behind RequireKey, for pages on the origins the
// patterns match: a preflight gets 204 with what it may send, without reaching next (a
// preflight carries no key); other requests from those origins reach next and their
// responses say the origin may read them. Requests from other origins, or without one, are
// passed through untouched (a browser then keeps the response from the page; the API
// refuses them anyway).
func CORS(patterns []string, next http.Handler) http.Handler {
	if len(patterns) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin == "" || !originAllowed(origin, patterns) {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", origin)
		h.Add("Vary", "Origin")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
			h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
			h.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
		// The OpenAI handler behind refuses every request with a foreign Origin: its
		// defence, as a loopback API without keys, against pages posting to it. Here every
		// request must carry a key (RequireKey) and the origin is one the operator named, so
		// the request goes on without its Origin.
		r = r.Clone(r.Context())
		r.Header.Del("Origin")
		next.ServeHTTP(w, r)
	})
}
