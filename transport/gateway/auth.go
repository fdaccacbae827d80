package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

// APIKeyHeader carries the key when a client cannot set Authorization; RequireKey accepts
// either.
const APIKeyHeader = "X-Api-Key"

// DeviceHeader carries the client's device id: a stable id it chooses (a UUID, say; meshinfer
// chat sends one derived from the machine, "dev_" and 32 hex digits), so that one key used
// on several devices makes several sessions, and the meter records which device used what.
const DeviceHeader = "X-Meshinfer-Device"

// MaxDeviceID bounds a device id in bytes: a UUID is 36, a hostname at most 253 but rarely
// over 64; the id is kept per session, so it must stay small.
const MaxDeviceID = 128

// createHint ends every refusal of a key: what to do about it.
const createHint = "create one with: meshinfer keys create --name NAME (on the coordinator)"

// codeInvalidAPIKey is error.code in every 401, as in OpenAI's API.
const codeInvalidAPIKey = "invalid_api_key"

// OpenAI error types (error.type), as transport/openai uses them.
const (
	typeInvalidRequest = "invalid_request_error"
	typeServer         = "server_error"
)

// Session is an authenticated client: a key and a device. RequireKey puts it in the request's
// context.
type Session struct {
	KeyID    string // the key's ID, never the key
	KeyName  string
	DeviceID string // from DeviceHeader; "" when the client sent none
}

// ID identifies the session: KeyID, "/", DeviceID. KeyID has a fixed form without '/', so
// the two parts never run together.
func (s Session) ID() string { return s.KeyID + "/" + s.DeviceID }

type sessionKey struct{}

// SessionFrom returns the Session RequireKey put in ctx.
func SessionFrom(ctx context.Context) (Session, bool) {
	s, ok := ctx.Value(sessionKey{}).(Session)
	return s, ok
}

func withSession(ctx context.Context, s Session) context.Context {
	return context.WithValue(ctx, sessionKey{}, s)
}

// RequireKey serves next only for requests that carry a live key of ks, as
// "Authorization: Bearer <key>" or in APIKeyHeader (both at once must agree). A missing,
// malformed, unknown or revoked key gets 401 with OpenAI's error JSON (code invalid_api_key),
// a WWW-Authenticate: Bearer header and a message that says what to do; a DeviceHeader that
// is not 1 to MaxDeviceID visible ASCII characters gets 400 (invalid_request); a key store
// that cannot be read gets 503 (unavailable): the request is refused, never let through.
//
// next sees the Session in the request's context (SessionFrom) and no longer sees the key:
// both headers are removed from its copy of the request, so nothing downstream can log or
// forward them. RequireKey itself logs nothing.
//
// A browser cannot set headers on a WebSocket: it offers the key as a subprotocol instead,
// new WebSocket(url, ["meshinfer.v1", key]). RequireKey takes a key from
// Sec-WebSocket-Protocol when neither header carries one, and removes it from next's copy of
// that header too, so the gateway selects Subprotocol and never echoes the key.
func RequireKey(ks *KeyStore, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plaintext, err := keyFromHeader(r.Header)
		fromProtocol := false
		if errors.Is(err, ErrKeyMissing) {
			if k, ok := keyFromSubprotocols(r.Header); ok {
				plaintext, err, fromProtocol = k, nil, true
			}
		}
		var k Key
		if err == nil {
			k, err = ks.Check(plaintext)
		}
		if err != nil {
			refuseKey(w, err)
			return
		}
		device, err := deviceFromHeader(r.Header)
		if err != nil {
			writeError(w, http.StatusBadRequest, string(inference.CodeInvalidRequest), err.Error())
			return
		}
		h := r.Header.Clone()
		h.Del("Authorization")
		h.Del(APIKeyHeader)
		if fromProtocol {
			h.Del(protocolHeader)
			if rest := withoutKeys(r.Header); rest != "" {
				h.Set(protocolHeader, rest)
			}
		}
		r = r.WithContext(withSession(r.Context(), Session{KeyID: k.ID, KeyName: k.Name, DeviceID: device}))
		r.Header = h
		next.ServeHTTP(w, r)
	})
}

// keyFromHeader returns the key a request presents. Its errors match ErrKeyMissing or
// ErrKeyMalformed, with a detail that never quotes the key.
func keyFromHeader(h http.Header) (string, error) {
	auths, alts := h.Values("Authorization"), h.Values(APIKeyHeader)
	if len(auths) > 1 || len(alts) > 1 {
		return "", malformed("more than one Authorization or " + APIKeyHeader + " header")
	}
	var bearer, alt string
	if len(auths) == 1 && strings.TrimSpace(auths[0]) != "" {
		scheme, token, _ := strings.Cut(strings.TrimSpace(auths[0]), " ")
		if !strings.EqualFold(scheme, "Bearer") {
			return "", malformed("the Authorization header must be 'Bearer' and the key")
		}
		if bearer = strings.TrimSpace(token); bearer == "" {
			return "", malformed("the Authorization header has no key after 'Bearer'")
		}
	}
	if len(alts) == 1 {
		alt = strings.TrimSpace(alts[0])
	}
	switch {
	case bearer != "" && alt != "" && bearer != alt:
		return "", malformed("the Authorization and " + APIKeyHeader + " headers carry different keys")
	case bearer != "":
		return bearer, nil
	case alt != "":
		return alt, nil
	}
	return "", ErrKeyMissing
}

// protocolHeader lists the subprotocols a WebSocket client offers.
const protocolHeader = "Sec-WebSocket-Protocol"

// subprotocols returns the subprotocols offered in h, in order.
func subprotocols(h http.Header) []string {
	var out []string
	for _, v := range h.Values(protocolHeader) {
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// keyFromSubprotocols returns the key a browser offered as a subprotocol: the one offered
// subprotocol that starts with KeyPrefix. Two such are none.
func keyFromSubprotocols(h http.Header) (string, bool) {
	key, n := "", 0
	for _, p := range subprotocols(h) {
		if strings.HasPrefix(p, KeyPrefix) {
			key, n = p, n+1
		}
	}
	return key, n == 1
}

// withoutKeys is h's list of offered subprotocols without any key.
func withoutKeys(h http.Header) string {
	var rest []string
	for _, p := range subprotocols(h) {
		if !strings.HasPrefix(p, KeyPrefix) {
			rest = append(rest, p)
		}
	}
	return strings.Join(rest, ", ")
}

// headerError is keyFromHeader's error for a header that holds no usable key: it matches
// ErrKeyMalformed and says what is wrong, without quoting the key.
type headerError struct{ detail string }

func malformed(detail string) error { return &headerError{detail: detail} }

func (e *headerError) Error() string { return ErrKeyMalformed.Error() + ": " + e.detail }
func (e *headerError) Unwrap() error { return ErrKeyMalformed }

// deviceFromHeader returns the device id of a request: "" when absent, else 1 to
// MaxDeviceID visible ASCII characters (no spaces, no control characters).
func deviceFromHeader(h http.Header) (string, error) {
	vs := h.Values(DeviceHeader)
	const rule = "a stable id of this device such as a UUID, at most %d visible ASCII characters without spaces; or leave the header out"
	switch {
	case len(vs) == 0:
		return "", nil
	case len(vs) > 1:
		return "", fmt.Errorf("more than one %s header: send one, "+rule, DeviceHeader, MaxDeviceID)
	case len(vs[0]) > MaxDeviceID:
		return "", fmt.Errorf("%s is %d bytes: send "+rule, DeviceHeader, len(vs[0]), MaxDeviceID)
	}
	if i := invisibleAt(vs[0]); i >= 0 {
		return "", fmt.Errorf("%s has a character that is not visible ASCII at byte %d: send "+rule, DeviceHeader, i, MaxDeviceID)
	}
	return vs[0], nil
}

// validDevice reports whether s is a device id as deviceFromHeader accepts it, or "" (none).
func validDevice(s string) bool { return len(s) <= MaxDeviceID && invisibleAt(s) < 0 }

// invisibleAt is the index of the first byte of s that is not visible ASCII (0x21 to
// 0x7e), or -1.
func invisibleAt(s string) int {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e {
			return i
		}
	}
	return -1
}

// refuseKey answers a request whose key Check (or keyFromHeader) refused.
func refuseKey(w http.ResponseWriter, err error) {
	var msg string
	challenge := `Bearer realm="meshinfer", error="invalid_token"` // RFC 6750 §3.1
	revoked, isRevoked := errors.AsType[*RevokedError](err)
	switch {
	case errors.Is(err, ErrKeyMissing):
		challenge = `Bearer realm="meshinfer"` // no error code when no credentials came (§3.1)
		msg = "missing API key: send it as 'Authorization: Bearer " + KeyPrefix + "…' or in an " + APIKeyHeader + " header; " + createHint
	case errors.Is(err, ErrKeyMalformed):
		var detail string
		if he, ok := errors.AsType[*headerError](err); ok {
			detail = " (" + he.detail + ")"
		}
		msg = fmt.Sprintf("malformed API key%s: a key is %s and %d characters a-z and 2-7, exactly as 'meshinfer keys create' printed it; %s",
			detail, KeyPrefix, KeyLen-len(KeyPrefix), createHint)
	case errors.Is(err, ErrKeyUnknown):
		msg = "unknown API key: this coordinator has no such key (was it copied whole, and made on this coordinator?); " + createHint
	case isRevoked:
		msg = fmt.Sprintf("API key %s was revoked at %s and no longer works; %s", revoked.Key.ID,
			revoked.Key.RevokedAt.UTC().Format(time.RFC3339), createHint)
	default:
		// The store cannot be read: refuse, and say it is not the client's fault.
		writeError(w, http.StatusServiceUnavailable, string(inference.CodeUnavailable),
			"the coordinator cannot read its API keys: try again later, and tell its operator if this persists")
		return
	}
	w.Header().Set("WWW-Authenticate", challenge)
	writeError(w, http.StatusUnauthorized, codeInvalidAPIKey, msg)
}

// errorBody is OpenAI's error JSON, as transport/openai writes it.
type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"` // always null
	Code    string  `json:"code"`
}

// writeError answers with OpenAI's error JSON; type follows the status as in
// transport/openai.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	typ := typeInvalidRequest
	if status >= 500 {
		typ = typeServer
	}
	writeJSON(w, status, errorBody{Error: errorObject{Message: msg, Type: typ, Code: code}})
}

// writeJSON answers with v. Responses about keys and usage are never cached.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // cannot happen: our types only
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encode response","type":"server_error","param":null,"code":"unavailable"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(b, '\n')) // a client gone away is not ours to report
}
