package inference

import (
	"context"
	"errors"
	"fmt"
)

// Code names one terminal error of the closed set every layer of the data plane speaks. Its
// string value is the wire form: the peer protocol's terminal frame and the API's
// error.code carry it as is.
type Code string

// The closed set of terminal error codes. Adding one is a protocol change: peers running an
// older version decode it with ParseCode, fail, and must treat it as CodeUnavailable.
const (
	// CodeInvalidRequest: the request itself is wrong (bad field, over a limit). Retrying it
	// anywhere gives the same answer.
	CodeInvalidRequest Code = "invalid_request"
	// CodeModelNotFound: no reachable target serves the requested model.
	CodeModelNotFound Code = "model_not_found"
	// CodeContextOverflow: the prompt does not fit the model's context window.
	CodeContextOverflow Code = "context_overflow"
	// CodeOverloaded: the target is at its admission limit and refused at once.
	CodeOverloaded Code = "overloaded"
	// CodeTimeout: a deadline (first token, idle gap or total) passed.
	CodeTimeout Code = "timeout"
	// CodeUnavailable: the target could not serve for a reason it could not classify (a
	// backend down, a connection refused, an unknown error).
	CodeUnavailable Code = "unavailable"
	// CodePeerLost: the serving peer went away mid-request (stream reset, connection lost).
	CodePeerLost Code = "peer_lost"
	// CodeNoPeer: the router found no eligible target for the request.
	CodeNoPeer Code = "no_peer"
	// CodePolicyPaused: the serving node's participation policy paused mesh work (battery,
	// heat, metered network, user choice).
	CodePolicyPaused Code = "policy_paused"
	// CodeLocalUnavailable: a local-only request could not be served by the local backend.
	// By the privacy gate it never falls back to the network.
	CodeLocalUnavailable Code = "local_unavailable"
	// CodeVerificationFailed: the result did not match the verifier's replica.
	CodeVerificationFailed Code = "verification_failed"
	// CodeShuttingDown: the node is stopping and accepts no more work.
	CodeShuttingDown Code = "shutting_down"
	// CodeCoordinatorLost: a thin client's coordinator went away with the request in flight
	// (its connection dropped and no connection came back within the client's bound), or
	// the coordinator knows a resubmitted request completed and was billed but no longer
	// holds its output (after a restart, or once its result left the cache). Only the gateway's client and endpoint produce it;
	// a peer never sends it. Resubmitting the same idempotency key gets the same answer; a
	// fresh key runs (and bills) the request again.
	CodeCoordinatorLost Code = "coordinator_lost"
)

// Codes returns every code of the closed set, in declaration order. The slice is fresh; the
// caller may keep or modify it.
func Codes() []Code {
	return []Code{
		CodeInvalidRequest, CodeModelNotFound, CodeContextOverflow, CodeOverloaded,
		CodeTimeout, CodeUnavailable, CodePeerLost, CodeNoPeer, CodePolicyPaused,
		CodeLocalUnavailable, CodeVerificationFailed, CodeShuttingDown, CodeCoordinatorLost,
	}
}

// ParseCode decodes a code received from the wire. It reports false for anything outside the
// closed set (including the empty string); the caller then treats the error as
// CodeUnavailable, the same rule CodeOf applies to foreign errors.
func ParseCode(s string) (Code, bool) {
	switch c := Code(s); c {
	case CodeInvalidRequest, CodeModelNotFound, CodeContextOverflow, CodeOverloaded,
		CodeTimeout, CodeUnavailable, CodePeerLost, CodeNoPeer, CodePolicyPaused,
		CodeLocalUnavailable, CodeVerificationFailed, CodeShuttingDown, CodeCoordinatorLost:
		return c, true
	}
	return "", false
}

// HTTPStatus is the status the OpenAI-compatible API answers with for c. (Numbers rather than
// net/http's names keep this leaf package free of the HTTP stack.) A code outside the
// closed set gives 500: it can only come from a bug, never from a peer (ParseCode rejects it).
func (c Code) HTTPStatus() int {
	switch c {
	case CodeInvalidRequest, CodeContextOverflow:
		return 400 // bad request: the client must change the request
	case CodeModelNotFound:
		return 404 // not found: as OpenAI answers for an unknown model
	case CodeOverloaded:
		return 429 // too many requests: clients back off and retry
	case CodeTimeout:
		return 504 // gateway timeout: an upstream (backend or peer) was too slow
	case CodePeerLost, CodeVerificationFailed, CodeCoordinatorLost:
		return 502 // bad gateway: an upstream failed or returned a bad answer
	case CodeUnavailable, CodeNoPeer, CodePolicyPaused, CodeLocalUnavailable, CodeShuttingDown:
		return 503 // service unavailable: nothing can serve it right now
	}
	return 500 // internal server error
}

// Retryable reports whether a router may re-dispatch the whole request to another target
// after this error. The retryable codes describe the target, not the request: timeout,
// unavailable, peer_lost, overloaded, shutting_down and policy_paused. The others would fail
// the same way anywhere (invalid_request, model_not_found, context_overflow), end the search
// (no_peer), must not leave the node (local_unavailable, by the privacy gate), or must be
// surfaced rather than papered over (verification_failed, coordinator_lost: the request may
// have run and been billed).
func (c Code) Retryable() bool {
	switch c {
	case CodeTimeout, CodeUnavailable, CodePeerLost, CodeOverloaded, CodeShuttingDown, CodePolicyPaused:
		return true
	}
	return false
}

// Error is a typed terminal error. Code is one of the closed set; Message is human-readable
// detail and carries no meaning a program should parse.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`

	// cause is the error wrapped with %w by Errorf, if any; it stays local (it is not
	// encoded) and serves errors.Is/As, e.g. errors.Is(err, context.DeadlineExceeded).
	cause error
}

// Errorf returns an *Error with the given code and a message formatted as by fmt.Errorf.
// A %w verb wraps its operand: errors.Is and errors.As see through the result.
func Errorf(code Code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	e := &Error{Code: code, Message: err.Error()}
	switch err.(type) {
	case interface{ Unwrap() error }, interface{ Unwrap() []error }:
		e.cause = err // keep the chain (one or several %w operands) for errors.Is/As
	}
	return e
}

// Error returns "code: message", or the code alone when there is no message.
func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Message
}

// Unwrap returns the error that carries Errorf's %w operands, or nil.
func (e *Error) Unwrap() error { return e.cause }

// CodeOf returns the code of err: the Code of the first *Error in its chain; CodeTimeout for
// an error that wraps context.DeadlineExceeded; otherwise CodeUnavailable. CodeOf(nil) is "".
//
// An error that is not typed is mapped to unavailable because that is the one honest reading
// of "this target failed for a reason it did not classify": it blames the target, not the
// request (invalid_request would stop retries and blame the client), it is retryable so the
// router can try elsewhere, and reputation treats it as an availability failure (a cooldown),
// never as an integrity one. Cancellation by the caller (context.Canceled) also maps to
// unavailable: nobody is left to read that outcome, and callers that care test
// errors.Is(err, context.Canceled) first.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Code
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return CodeTimeout
	}
	return CodeUnavailable
}
