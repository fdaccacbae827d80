package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"unicode/utf8"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/sse"
)

// streamChunk is the part of one chat.completion.chunk event this backend reads; an error
// event has Error set instead.
type streamChunk struct {
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *inference.Usage `json:"usage"`
	Error json.RawMessage  `json:"error"`
}

// readStream reads a chat-completion event stream from r and emits its tokens. It returns
// the Result once the stream has ended well (a finish reason or [DONE] seen), emit's error
// unchanged if emit fails, or an *inference.Error. It reads r to its end or to [DONE], never
// more than maxLine bytes at a time.
func readStream(r io.Reader, emit func(inference.Token) error) (inference.Result, error) {
	sr := sse.NewReader(r, maxLine)
	var (
		finish inference.FinishReason // "" until a finish reason arrives
		usage  *inference.Usage       // the last usage the stream carried
		n      int                    // tokens emitted
		deltas int                    // content deltas received
		done   bool                   // [DONE] seen
	)
	for {
		data, err := sr.Next()
		if errors.Is(err, io.EOF) {
			done = true
			break
		}
		if errors.Is(err, sse.ErrNoDone) {
			break
		}
		if errors.Is(err, sse.ErrTooLong) {
			return inference.Result{}, inference.Errorf(inference.CodeUnavailable, "upstream sent an event line over %d bytes", maxLine)
		}
		if err != nil {
			return inference.Result{}, inference.Errorf(inference.CodeUnavailable, "reading the upstream stream: %w", err)
		}
		var c streamChunk
		if err := json.Unmarshal(data, &c); err != nil {
			return inference.Result{}, inference.Errorf(inference.CodeUnavailable, "upstream sent a malformed event: %v", err)
		}
		if len(c.Error) > 0 && !bytes.Equal(c.Error, []byte("null")) {
			return inference.Result{}, eventError(c.Error)
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		for _, ch := range c.Choices {
			if ch.Index != 0 {
				continue // n is always 1: other choices are not ours
			}
			if ch.Delta.Content != nil && *ch.Delta.Content != "" {
				deltas++
				for content := *ch.Delta.Content; content != ""; {
					piece := cut(content, maxTokenText)
					content = content[len(piece):]
					if err := emit(inference.Token{Index: n, Text: piece, ID: -1}); err != nil {
						return inference.Result{}, err
					}
					n++
				}
			}
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				finish = mapFinish(*ch.FinishReason)
			}
		}
	}
	if !done && finish == "" {
		return inference.Result{}, inference.Errorf(inference.CodeUnavailable,
			"upstream stream ended without a finish reason after %d tokens", n)
	}
	if finish == "" {
		finish = inference.FinishStop
	}
	return inference.Result{FinishReason: finish, Usage: resultUsage(usage, deltas)}, nil
}

// cut returns the longest prefix of s of at most max bytes that ends on a UTF-8 boundary (a
// whole first rune if that alone is longer, which cannot happen for max ≥ 4).
func cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	if i == 0 {
		_, size := utf8.DecodeRuneInString(s)
		return s[:size]
	}
	return s[:i]
}

// mapFinish maps an upstream finish_reason: "length" is FinishLength; "stop" and every other
// reason (content_filter, tool_calls, eos, …) end the completion normally, FinishStop.
func mapFinish(reason string) inference.FinishReason {
	if reason == string(inference.FinishLength) {
		return inference.FinishLength
	}
	return inference.FinishStop
}

// resultUsage is the upstream's usage when it sent a plausible one, else a count: the content
// deltas received as completion tokens, the prompt unknown (0).
func resultUsage(u *inference.Usage, deltas int) inference.Usage {
	if u == nil || u.PromptTokens < 0 || u.CompletionTokens < 0 {
		return inference.Usage{CompletionTokens: deltas, TotalTokens: deltas}
	}
	out := *u
	out.TotalTokens = out.PromptTokens + out.CompletionTokens
	return out
}
