package upstream

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/meshinfer/meshinfer/inference"
)

// apiError is the error object of an OpenAI-style error body or stream event. Servers
// disagree on its shape: code is a string (OpenAI, meshinfer), a number (llama-server) or
// null, and Ollama's native errors are a bare string; decodeAPIError accepts each.
type apiError struct {
	Message string
	Type    string
	Code    string // "" unless the server sent a string
}

// decodeAPIError decodes the value of an "error" member: an object or a string. It returns
// ok false for anything else.
func decodeAPIError(raw json.RawMessage) (apiError, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return apiError{Message: s}, true
	}
	var o struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
	}
	if json.Unmarshal(raw, &o) != nil {
		return apiError{}, false
	}
	e := apiError{Message: o.Message, Type: o.Type}
	_ = json.Unmarshal(o.Code, &e.Code) // a number or null leaves it ""
	return e, true
}

// describe is the detail an *inference.Error carries: the upstream's message, else its code
// or type.
func (e apiError) describe() string {
	for _, s := range []string{e.Message, e.Code, e.Type} {
		if s != "" {
			return s
		}
	}
	return "no detail"
}

// aboutContext reports whether e says the prompt does not fit the model's context window.
func (e apiError) aboutContext() bool {
	if e.Code == "context_length_exceeded" || e.Code == string(inference.CodeContextOverflow) ||
		e.Type == "exceed_context_size_error" {
		return true
	}
	m := strings.ToLower(e.Message)
	return strings.Contains(m, "context length") || strings.Contains(m, "maximum context") ||
		strings.Contains(m, "context size")
}

// aboutModel reports whether a 404 is about the model rather than the URL.
func (e apiError) aboutModel() bool {
	return e.Code == string(inference.CodeModelNotFound) || strings.Contains(strings.ToLower(e.Message), "model")
}

// eventError maps an error event received in the stream: its code when it is one of
// inference's, else unavailable.
func eventError(raw json.RawMessage) error {
	e, ok := decodeAPIError(raw)
	if !ok {
		return inference.Errorf(inference.CodeUnavailable, "upstream failed mid-stream with an unreadable error")
	}
	code, known := inference.ParseCode(e.Code)
	if !known {
		code = inference.CodeUnavailable
	}
	return inference.Errorf(code, "upstream failed mid-stream: %s", e.describe())
}

// maxDetail bounds the bytes of a non-JSON error body quoted in an error message.
const maxDetail = 200

// statusError maps a response whose status is not 200, reading its error body from body
// (which the caller bounds). See the package documentation for the table.
func statusError(status int, body io.Reader) error {
	var e apiError
	var wrapper struct {
		Error json.RawMessage `json:"error"`
	}
	b, _ := io.ReadAll(body) // a failed read leaves what arrived; the status decides anyway
	if json.Unmarshal(b, &wrapper) == nil && len(wrapper.Error) > 0 {
		e, _ = decodeAPIError(wrapper.Error)
	}
	if e.Message == "" && e.Code == "" && e.Type == "" {
		e.Message = strings.TrimSpace(string(b))
		if len(e.Message) > maxDetail { // a whole HTML page says nothing more
			e.Message = cut(e.Message, maxDetail) + "…"
		}
	}
	detail := e.describe()
	code := inference.CodeUnavailable
	switch {
	case status == http.StatusBadRequest && e.aboutContext():
		code = inference.CodeContextOverflow
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		detail = "check the API key: " + detail
	case status == http.StatusNotFound && e.aboutModel():
		code = inference.CodeModelNotFound
	case status == http.StatusNotFound:
		detail = "check the base URL: " + detail
	case status == http.StatusRequestTimeout:
		code = inference.CodeTimeout
	case status == http.StatusTooManyRequests:
		code = inference.CodeOverloaded
	case status >= 400 && status < 500:
		code = inference.CodeInvalidRequest
	}
	return inference.Errorf(code, "upstream answered %d %s: %s", status, http.StatusText(status), detail)
}

// transportError maps a failure to get a response at all (the caller has ruled out its own
// context): a dial error is unavailable, any other timeout is a timeout, the rest is
// unavailable.
func transportError(err error) error {
	if op, ok := errors.AsType[*net.OpError](err); ok && op.Op == "dial" {
		return inference.Errorf(inference.CodeUnavailable, "upstream unreachable: %w", err)
	}
	if dns, ok := errors.AsType[*net.DNSError](err); ok {
		return inference.Errorf(inference.CodeUnavailable, "upstream unreachable: %w", dns)
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return inference.Errorf(inference.CodeTimeout, "upstream: %w", err)
	}
	return inference.Errorf(inference.CodeUnavailable, "upstream: %w", err)
}
