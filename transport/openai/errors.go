package openai

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/meshinfer/meshinfer/inference"
)

// OpenAI error types, chosen from the HTTP status (errorType). Clients act on the status and
// on error.code (the typed inference code); type is informative, as in OpenAI's API.
const (
	typeInvalidRequest = "invalid_request_error" // any 4xx but 429: change the request
	typeRateLimit      = "rate_limit_error"      // 429 (overloaded): back off and retry
	typeServer         = "server_error"          // any 5xx: nothing wrong with the request
)

// errorType maps an HTTP status to OpenAI's error.type.
func errorType(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return typeRateLimit
	case status >= 500:
		return typeServer
	}
	return typeInvalidRequest
}

// terminalError turns a Dispatcher's error into the typed error the client receives. When the
// request's context was cancelled with an *inference.Error as its cause (the Server's Close
// does this with shutting_down), that cause wins over whatever the Dispatcher made of the
// cancellation, which CodeOf can only read as unavailable.
func terminalError(ctx context.Context, err error) *inference.Error {
	if ctx.Err() != nil {
		if e, ok := errors.AsType[*inference.Error](context.Cause(ctx)); ok {
			return e
		}
	}
	if e, ok := errors.AsType[*inference.Error](err); ok {
		return e
	}
	return &inference.Error{Code: inference.CodeOf(err), Message: err.Error()}
}

// encodeError returns the error JSON of e (without a trailing newline).
func encodeError(e *inference.Error, status int) []byte {
	b, err := json.Marshal(errorBody{Error: errorObject{
		Message: e.Message,
		Type:    errorType(status),
		Code:    string(e.Code),
	}})
	if err != nil { // cannot happen: strings only
		return []byte(`{"error":{"message":"","type":"server_error","param":null,"code":"unavailable"}}`)
	}
	return b
}

// writeError answers with e in OpenAI's error shape and e's status.
func writeError(w http.ResponseWriter, e *inference.Error) {
	writeErrorStatus(w, e, e.Code.HTTPStatus())
}

// writeErrorStatus answers with e and an explicit status, for the HTTP-level refusals that
// have no code of their own (404 unknown path, 405 method, 413 body too large): their code is
// invalid_request.
func writeErrorStatus(w http.ResponseWriter, e *inference.Error, status int) {
	writeBody(w, status, append(encodeError(e, status), '\n'))
}

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // cannot happen: our types only
		writeError(w, inference.Errorf(inference.CodeUnavailable, "encode response: %v", err))
		return
	}
	writeBody(w, status, append(b, '\n'))
}

func writeBody(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	setWriteDeadline(w)
	w.WriteHeader(status)
	if _, err := w.Write(body); err != nil {
		log.Debugw("write response", "err", err)
	}
}

func invalidf(format string, args ...any) *inference.Error {
	return inference.Errorf(inference.CodeInvalidRequest, format, args...)
}
