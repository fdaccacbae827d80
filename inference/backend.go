package inference

import "context"

// FinishReason says why a successful completion ended.
type FinishReason string

const (
	// FinishStop: the model produced its end-of-text token or a stop string appeared.
	FinishStop FinishReason = "stop"
	// FinishLength: the completion reached max_tokens or the model's context window.
	FinishLength FinishReason = "length"
)

// Token is one piece of streamed output.
type Token struct {
	// Index is the token's position in the completion: 0 for the first one emitted, then
	// contiguous.
	Index int `json:"index"`
	// Text is the token's text. Concatenating the texts of a stream gives the completion.
	// It is never empty. When a stop string begins inside a token, that last token's Text
	// is cut where the stop string begins.
	Text string `json:"text"`
	// ID is the token's id in the model's vocabulary, or -1 when the backend does not know
	// it (an upstream API streams text, not ids).
	ID int `json:"id"`
}

// Usage counts the tokens of one completion, as OpenAI's usage object does.
type Usage struct {
	// PromptTokens is the length of the prompt as the model saw it (chat template included).
	PromptTokens int `json:"prompt_tokens"`
	// CompletionTokens counts the tokens the model generated: the emitted ones plus any that
	// a stop string swallowed, as OpenAI bills them; an end-of-text token is not counted.
	CompletionTokens int `json:"completion_tokens"`
	// TotalTokens is PromptTokens + CompletionTokens.
	TotalTokens int `json:"total_tokens"`
}

// Result is the terminal outcome of a successful Generate.
type Result struct {
	FinishReason FinishReason `json:"finish_reason"`
	Usage        Usage        `json:"usage"`
	// Replayed is how many of Request.Replay's tokens the backend took as given, prefilled
	// with the prompt in one batch: len(Replay) from one that replays (the built-in
	// models), 0 from one that generated them again (an upstream API), and 0 from a
	// Resumption that loaded rows (it prefilled only what they lacked). Its first token
	// came after a prefill of the prompt and these; the executor times that prefill
	// (node/dispatch/rates.go). A client holds a peer's figure to len(Replay).
	Replayed int `json:"replayed,omitempty"`
	// Receipt is the serving peer's signed record of the task (mesh/receipts defines it),
	// present only when the requester asked the peer for one; opaque at this level.
	Receipt string `json:"receipt,omitempty"`
}

// StageReceipt is a pipeline stage's signed receipt of its part of a request and the
// head's countersignature of it (mesh/receipts defines both); opaque at this level.
type StageReceipt struct {
	Receipt    string `json:"receipt"`
	Countersig string `json:"countersig"`
}

// ModelInfo describes a model a backend serves.
type ModelInfo struct {
	Name string `json:"name"`
	// Warm is true once the model is loaded: a request then pays no cold start.
	Warm bool `json:"warm"`
	// Deterministic is true when the output is a function of (model, messages, seed,
	// temperature, top_p, max_tokens, stop) alone, so that a cut stream can be resumed
	// elsewhere by regenerating and skipping what was sent. The synthetic presets are; an
	// upstream API is not assumed to be.
	Deterministic bool `json:"deterministic"`
}

// Backend runs inference for the models it serves. Implementations are safe for concurrent
// use by multiple goroutines.
type Backend interface {
	// Models lists the models this backend serves with their warm or cold state, in a
	// stable order. It answers from memory: the router asks on every request and reads it
	// on the request's path, so a backend that must ask a remote server refreshes its
	// listing in the background (inference/upstream). It may fail (any error; callers map
	// it with CodeOf).
	Models(ctx context.Context) ([]ModelInfo, error)

	// Generate runs one completion of req and streams it to emit. req is read, never
	// modified, and not retained after Generate returns. Its contract:
	//
	//   - Generate returns exactly once. On success the error is nil and the Result has
	//     FinishStop or FinishLength; on failure the Result is the zero value and the error
	//     is non-nil.
	//   - emit is called synchronously on the goroutine that called Generate, once per
	//     token, in order, with Index 0, 1, …, n−1 and non-empty Text. It is never called
	//     after Generate returns, nor concurrently.
	//   - If emit returns an error, Generate stops at once (emitting nothing more) and
	//     returns that same error unchanged.
	//   - Generate checks ctx between tokens, and during loading and prompt processing, and
	//     once ctx is done it stops promptly and returns an error that wraps ctx.Err(), so
	//     errors.Is(err, context.Canceled) or errors.Is(err, context.DeadlineExceeded)
	//     holds and CodeOf gives timeout for a deadline.
	//   - Every other failure is an *Error: model_not_found for a model this backend does
	//     not serve, invalid_request for a request it cannot run, context_overflow for a
	//     prompt longer than the model's context window, and unavailable (or a more precise
	//     code) for failures of the backend itself.
	//   - Tokens already emitted stand; the terminal outcome is the return value. A caller
	//     that needs a terminal frame sends it after Generate returns, never from emit.
	Generate(ctx context.Context, req *Request, emit func(Token) error) (Result, error)
}
