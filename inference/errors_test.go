package inference

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
)

func TestCodeTable(t *testing.T) {
	tests := []struct {
		code      Code
		status    int
		retryable bool
	}{
		{CodeInvalidRequest, 400, false},
		{CodeModelNotFound, 404, false},
		{CodeContextOverflow, 400, false},
		{CodeOverloaded, 429, true},
		{CodeTimeout, 504, true},
		{CodeUnavailable, 503, true},
		{CodePeerLost, 502, true},
		{CodeNoPeer, 503, false},
		{CodePolicyPaused, 503, true},
		{CodeLocalUnavailable, 503, false},
		{CodeVerificationFailed, 502, false},
		{CodeShuttingDown, 503, true},
		{CodeCoordinatorLost, 502, false},
	}
	if len(tests) != len(Codes()) {
		t.Fatalf("table has %d codes, Codes() has %d", len(tests), len(Codes()))
	}
	for i, tt := range tests {
		if Codes()[i] != tt.code {
			t.Errorf("Codes()[%d] = %q, want %q", i, Codes()[i], tt.code)
		}
		if got := tt.code.HTTPStatus(); got != tt.status {
			t.Errorf("%s.HTTPStatus() = %d, want %d", tt.code, got, tt.status)
		}
		if got := tt.code.Retryable(); got != tt.retryable {
			t.Errorf("%s.Retryable() = %v, want %v", tt.code, got, tt.retryable)
		}
		got, ok := ParseCode(string(tt.code))
		if !ok || got != tt.code {
			t.Errorf("ParseCode(%q) = %q, %v; want %q, true", tt.code, got, ok, tt.code)
		}
	}
}

func TestParseCodeRejectsUnknown(t *testing.T) {
	for _, s := range []string{"", "INVALID_REQUEST", "invalid_request ", "cancelled", "coordinator_lost ", "COORDINATOR_LOST", "500"} {
		if c, ok := ParseCode(s); ok || c != "" {
			t.Errorf("ParseCode(%q) = %q, %v; want \"\", false", s, c, ok)
		}
	}
	if got := Code("bogus").HTTPStatus(); got != 500 {
		t.Errorf("unknown code HTTPStatus = %d, want 500", got)
	}
	if Code("bogus").Retryable() {
		t.Errorf("unknown code is retryable")
	}
}

func TestCodeOf(t *testing.T) {
	typed := Errorf(CodeOverloaded, "node at capacity")
	tests := []struct {
		name string
		err  error
		want Code
	}{
		{"nil", nil, ""},
		{"typed", typed, CodeOverloaded},
		{"wrapped typed", fmt.Errorf("dispatch: %w", typed), CodeOverloaded},
		{"typed wrapping deadline", Errorf(CodePeerLost, "read: %w", context.DeadlineExceeded), CodePeerLost},
		{"deadline", fmt.Errorf("call: %w", context.DeadlineExceeded), CodeTimeout},
		{"canceled", context.Canceled, CodeUnavailable},
		{"foreign", io.ErrUnexpectedEOF, CodeUnavailable},
		{"joined", errors.Join(io.EOF, typed), CodeOverloaded},
	}
	for _, tt := range tests {
		if got := CodeOf(tt.err); got != tt.want {
			t.Errorf("%s: CodeOf = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestErrorfWraps(t *testing.T) {
	err := Errorf(CodeTimeout, "first token: %w", context.DeadlineExceeded)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("errors.Is(%v, DeadlineExceeded) = false", err)
	}
	if got, want := err.Error(), "timeout: first token: context deadline exceeded"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	two := Errorf(CodeUnavailable, "%w and %w", io.EOF, context.Canceled)
	if !errors.Is(two, io.EOF) || !errors.Is(two, context.Canceled) {
		t.Errorf("multi-%%w error lost a cause: %v", two)
	}
	plain := Errorf(CodeNoPeer, "no candidate for %q", "m")
	if plain.Unwrap() != nil {
		t.Errorf("Unwrap of an error without %%w = %v, want nil", plain.Unwrap())
	}
	if got := (&Error{Code: CodeShuttingDown}).Error(); got != "shutting_down" {
		t.Errorf("Error() without message = %q", got)
	}
}
