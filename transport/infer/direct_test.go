package infer

import (
	"errors"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
)

// A direct task's result frame carries the result, or the typed error with the usage of
// what the client got and whether the client went away.
func TestDirectResultFrames(t *testing.T) {
	partial := inference.Usage{CompletionTokens: 7, TotalTokens: 7}
	for _, tt := range []struct {
		name        string
		res         inference.Result
		err         error
		wantRes     inference.Result
		wantCode    inference.Code
		wantGoneErr bool
	}{
		{name: "completed",
			res:     inference.Result{FinishReason: inference.FinishStop, Usage: inference.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}, Receipt: "r"},
			wantRes: inference.Result{FinishReason: inference.FinishStop, Usage: inference.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}, Receipt: "r"}},
		{name: "failed before any token", err: inference.Errorf(inference.CodeOverloaded, "busy"),
			wantCode: inference.CodeOverloaded},
		{name: "failed mid-stream", res: inference.Result{Usage: partial}, err: inference.Errorf(inference.CodeTimeout, "slow"),
			wantRes: inference.Result{Usage: partial}, wantCode: inference.CodeTimeout},
		{name: "client went away", res: inference.Result{Usage: partial},
			err:     inference.Errorf(inference.CodePeerLost, "ended: %w", ErrClientDisconnected),
			wantRes: inference.Result{Usage: partial}, wantCode: inference.CodePeerLost, wantGoneErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := EncodeResult(tt.res, tt.err)
			if !IsResultFrame(b) || len(b) > MaxTerminalFrame {
				t.Fatalf("frame %q: not a result frame within %d bytes", b, MaxTerminalFrame)
			}
			res, err := DecodeResult(b)
			if res != tt.wantRes {
				t.Errorf("result %+v, want %+v", res, tt.wantRes)
			}
			if tt.err == nil {
				if err != nil {
					t.Fatalf("error %v, want none", err)
				}
				return
			}
			if inference.CodeOf(err) != tt.wantCode || errors.Is(err, ErrClientDisconnected) != tt.wantGoneErr {
				t.Errorf("error %v: want code %s, client gone %v", err, tt.wantCode, tt.wantGoneErr)
			}
		})
	}
	// A failed frame that does not decode is a protocol error, not a typed one.
	if _, err := DecodeResult([]byte{frameFailed, '{'}); !errors.Is(err, errProtocol) {
		t.Errorf("malformed failed frame: %v, want a protocol error", err)
	}
}
