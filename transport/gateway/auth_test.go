package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// wireError is OpenAI's error JSON as a client decodes it.
type wireError struct {
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

// seenRequest is what the handler behind RequireKey saw.
type seenRequest struct {
	session Session
	ok      bool
	header  http.Header
}

// serve runs one request through RequireKey and returns the response and what the inner
// handler saw (nil when it was not called).
func serve(t *testing.T, ks *KeyStore, header http.Header) (*httptest.ResponseRecorder, *seenRequest) {
	t.Helper()
	var seen *seenRequest
	h := RequireKey(ks, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, ok := SessionFrom(r.Context())
		seen = &seenRequest{session: s, ok: ok, header: r.Header}
		w.WriteHeader(http.StatusNoContent)
	}))
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader("{}"))
	for k, vs := range header {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w, seen
}

func decodeError(t *testing.T, w *httptest.ResponseRecorder) wireError {
	t.Helper()
	var e wireError
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error == nil {
		t.Fatalf("body is not OpenAI's error JSON (%v):\n%s", err, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if !strings.Contains(w.Body.String(), `"param":null`) {
		t.Errorf("error.param is not null:\n%s", w.Body)
	}
	return e
}

func TestRequireKeyRefuses(t *testing.T) {
	dir := t.TempDir()
	ks := openKeys(t, dir)
	live, _ := createKey(t, ks, "alice")
	revoked, rk := createKey(t, ks, "bob")
	revokedAt := time.Date(2026, 5, 2, 9, 30, 0, 0, time.UTC)
	if _, err := ks.Revoke(rk.ID, revokedAt); err != nil {
		t.Fatal(err)
	}
	unknown := KeyPrefix + strings.Repeat("a", KeyLen-len(KeyPrefix))
	bearer := func(k string) http.Header { return http.Header{"Authorization": {"Bearer " + k}} }

	tests := []struct {
		name      string
		header    http.Header
		challenge string   // WWW-Authenticate
		words     []string // in the message, besides the hint
		secret    string   // must not be echoed
	}{
		{"no header", nil, `Bearer realm="meshinfer"`, []string{"missing API key", "Authorization: Bearer msk_live_", "X-Api-Key"}, ""},
		{"empty authorization", http.Header{"Authorization": {""}}, `Bearer realm="meshinfer"`, []string{"missing API key"}, ""},
		{"empty x-api-key", http.Header{"X-Api-Key": {" "}}, `Bearer realm="meshinfer"`, []string{"missing API key"}, ""},
		{"basic auth", http.Header{"Authorization": {"Basic YWxpY2U6cHc="}}, `Bearer realm="meshinfer", error="invalid_token"`,
			[]string{"malformed API key", "'Bearer' and the key"}, "YWxpY2U6cHc="},
		{"bearer without key", http.Header{"Authorization": {"Bearer "}}, `Bearer realm="meshinfer", error="invalid_token"`,
			[]string{"malformed API key", "no key after 'Bearer'"}, ""},
		{"wrong form", bearer("sk-proj-abcdef123456"), `Bearer realm="meshinfer", error="invalid_token"`,
			[]string{"malformed API key", "msk_live_ and 52 characters"}, "sk-proj-abcdef123456"},
		{"truncated", bearer(live[:40]), `Bearer realm="meshinfer", error="invalid_token"`,
			[]string{"malformed API key"}, live[:40]},
		{"two authorization headers", http.Header{"Authorization": {"Bearer " + live, "Bearer " + live}},
			`Bearer realm="meshinfer", error="invalid_token"`, []string{"malformed API key", "more than one"}, live},
		{"headers disagree", http.Header{"Authorization": {"Bearer " + live}, "X-Api-Key": {unknown}},
			`Bearer realm="meshinfer", error="invalid_token"`, []string{"malformed API key", "different keys"}, live},
		{"unknown", bearer(unknown), `Bearer realm="meshinfer", error="invalid_token"`, []string{"unknown API key"}, unknown},
		{"unknown in x-api-key", http.Header{"X-Api-Key": {unknown}}, `Bearer realm="meshinfer", error="invalid_token"`,
			[]string{"unknown API key"}, unknown},
		{"revoked", bearer(revoked), `Bearer realm="meshinfer", error="invalid_token"`,
			[]string{"API key " + rk.ID + " was revoked at 2026-05-02T09:30:00Z"}, revoked},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, seen := serve(t, ks, tc.header)
			if seen != nil {
				t.Errorf("the inner handler was called")
			}
			if w.Code != http.StatusUnauthorized {
				t.Errorf("status %d, want 401", w.Code)
			}
			if got := w.Header().Get("WWW-Authenticate"); got != tc.challenge {
				t.Errorf("WWW-Authenticate %q, want %q", got, tc.challenge)
			}
			if got := w.Header().Get("Cache-Control"); got != "no-store" {
				t.Errorf("Cache-Control %q, want no-store", got)
			}
			e := decodeError(t, w)
			if e.Error.Type != "invalid_request_error" || e.Error.Code != "invalid_api_key" {
				t.Errorf("type %q code %q, want invalid_request_error invalid_api_key", e.Error.Type, e.Error.Code)
			}
			for _, s := range append(tc.words, "create one with: meshinfer keys create --name NAME") {
				if !strings.Contains(e.Error.Message, s) {
					t.Errorf("message does not contain %q: %s", s, e.Error.Message)
				}
			}
			if tc.secret != "" && strings.Contains(w.Body.String(), tc.secret) {
				t.Errorf("the response echoes the presented key:\n%s", w.Body)
			}
		})
	}
}

func TestRequireKeyAccepts(t *testing.T) {
	ks := openKeys(t, t.TempDir())
	plain, k := createKey(t, ks, "alice")
	tests := []struct {
		name   string
		header http.Header
		device string
	}{
		{"bearer", http.Header{"Authorization": {"Bearer " + plain}}, ""},
		{"lower-case scheme, extra spaces", http.Header{"Authorization": {"bearer   " + plain + " "}}, ""},
		{"x-api-key", http.Header{"X-Api-Key": {plain}}, ""},
		{"both, agreeing", http.Header{"Authorization": {"Bearer " + plain}, "X-Api-Key": {plain}}, ""},
		{"with device", http.Header{"Authorization": {"Bearer " + plain}, DeviceHeader: {"3f2c1a9e-phone"}}, "3f2c1a9e-phone"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, seen := serve(t, ks, tc.header)
			if w.Code != http.StatusNoContent || seen == nil {
				t.Fatalf("status %d, inner handler called %v; want 204 from it\n%s", w.Code, seen != nil, w.Body)
			}
			want := Session{KeyID: k.ID, KeyName: "alice", DeviceID: tc.device}
			if !seen.ok || seen.session != want {
				t.Errorf("session %+v (found %v), want %+v", seen.session, seen.ok, want)
			}
			if want := k.ID + "/" + tc.device; seen.session.ID() != want {
				t.Errorf("session ID %q, want %q", seen.session.ID(), want)
			}
			for name, vs := range seen.header {
				for _, v := range vs {
					if strings.Contains(v, plain) {
						t.Errorf("the inner handler sees the key in %s", name)
					}
				}
			}
		})
	}
}

func TestRequireKeyDeviceHeader(t *testing.T) {
	ks := openKeys(t, t.TempDir())
	plain, _ := createKey(t, ks, "alice")
	tests := []struct {
		name    string
		devices []string
		want    string // device id; "!" for a 400
	}{
		{"absent", nil, ""},
		{"empty", []string{""}, ""},
		{"uuid", []string{"0b9f6c3e-4a41-4d8a-9b7e-2f1c5d6a7e80"}, "0b9f6c3e-4a41-4d8a-9b7e-2f1c5d6a7e80"},
		{"punctuation", []string{"host.example:phone#2"}, "host.example:phone#2"},
		{"at the bound", []string{strings.Repeat("d", MaxDeviceID)}, strings.Repeat("d", MaxDeviceID)},
		{"over the bound", []string{strings.Repeat("d", MaxDeviceID+1)}, "!"},
		{"space", []string{"my phone"}, "!"},
		{"tab", []string{"my\tphone"}, "!"},
		{"control", []string{"phone\x01"}, "!"},
		{"non-ASCII", []string{"téléphone"}, "!"},
		{"two headers", []string{"a", "b"}, "!"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{"Authorization": {"Bearer " + plain}}
			for _, d := range tc.devices {
				h.Add(DeviceHeader, d)
			}
			w, seen := serve(t, ks, h)
			if tc.want != "!" {
				if w.Code != http.StatusNoContent || seen == nil || seen.session.DeviceID != tc.want {
					t.Errorf("status %d, session %+v; want 204 with device %q\n%s", w.Code, seen, tc.want, w.Body)
				}
				return
			}
			if w.Code != http.StatusBadRequest || seen != nil {
				t.Fatalf("status %d, inner handler called %v; want 400", w.Code, seen != nil)
			}
			e := decodeError(t, w)
			if e.Error.Type != "invalid_request_error" || e.Error.Code != "invalid_request" ||
				!strings.Contains(e.Error.Message, DeviceHeader) || !strings.Contains(e.Error.Message, "UUID") {
				t.Errorf("error %+v: want invalid_request naming %s and what to send", *e.Error, DeviceHeader)
			}
		})
	}
}

// A key store that cannot be read refuses every request as unavailable, never lets one
// through and never calls it the client's fault.
func TestRequireKeyUnreadableStore(t *testing.T) {
	dir := t.TempDir()
	ks := openKeys(t, dir)
	plain, _ := createKey(t, ks, "alice")
	if err := os.WriteFile(filepath.Join(dir, KeysFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	w, seen := serve(t, ks, http.Header{"Authorization": {"Bearer " + plain}})
	if w.Code != http.StatusServiceUnavailable || seen != nil {
		t.Fatalf("status %d, inner handler called %v; want 503", w.Code, seen != nil)
	}
	e := decodeError(t, w)
	if e.Error.Type != "server_error" || e.Error.Code != "unavailable" || strings.Contains(e.Error.Message, dir) {
		t.Errorf("error %+v: want server_error unavailable without the path", *e.Error)
	}
}

func TestSessionFromWithoutSession(t *testing.T) {
	if s, ok := SessionFrom(context.Background()); ok || s != (Session{}) {
		t.Errorf("SessionFrom(empty context) = %+v, %v; want nothing", s, ok)
	}
}
