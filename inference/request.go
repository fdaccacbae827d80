package inference

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// Chat roles a Message may carry. "developer" is OpenAI's newer name for a system prompt.
// Tool and function messages are not supported: no backend here calls tools.
const (
	RoleSystem    = "system"
	RoleDeveloper = "developer"
	RoleUser      = "user"
	RoleAssistant = "assistant"
)

// Fixed bounds of the OpenAI chat API; unlike Limits they are not a node's choice.
const (
	// MaxStop is the most stop strings a request may carry (OpenAI's documented maximum).
	MaxStop = 4
	// MinTemperature and MaxTemperature bound temperature (OpenAI's range). 0 means greedy.
	MinTemperature = 0.0
	MaxTemperature = 2.0
	// DefaultTemperature and DefaultTopP apply when the request leaves them out (OpenAI's
	// defaults).
	DefaultTemperature = 1.0
	DefaultTopP        = 1.0
	// DefaultCompletionTokens is the completion budget of a request that sets neither max_tokens nor
	// max_completion_tokens. It is a constant, not a node setting, so that every node
	// generates the same stream for the same request (verification and resumption compare
	// streams across nodes).
	DefaultCompletionTokens = 256
)

// Message is one chat message. On the wire content is a string; a request may also send it
// as OpenAI's array of content parts, of which only "text" parts are accepted (their texts
// are concatenated), and null, which decodes as "".
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// UnmarshalJSON accepts content as a string, null, or an array of text parts.
func (m *Message) UnmarshalJSON(data []byte) error {
	var raw struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	content, err := decodeContent(raw.Content)
	if err != nil {
		return err
	}
	*m = Message{Role: raw.Role, Content: content}
	return nil
}

func decodeContent(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] != '[' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("message content: %w", err)
		}
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("message content: %w", err)
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("message content: unsupported part type %q", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// StopList is the stop field: up to MaxStop strings. On the wire it may be a single string
// or an array of strings, as in OpenAI's API; null and [] both decode to nil. It is a plain
// []string underneath, so a []string can be assigned to it.
type StopList []string

// UnmarshalJSON accepts a string, an array of strings, or null.
func (s *StopList) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case string(data) == "null":
		*s = nil
		return nil
	case len(data) > 0 && data[0] == '"':
		var one string
		if err := json.Unmarshal(data, &one); err != nil {
			return err
		}
		*s = StopList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(data, &many); err != nil {
		return err
	}
	if len(many) == 0 {
		many = nil
	}
	*s = many
	return nil
}

// Request is an OpenAI chat-completion request, restricted to the fields the mesh acts on.
// Unknown JSON fields are ignored. Optional numbers are pointers so that "absent" differs
// from zero; the effective values come from the methods below.
type Request struct {
	Model    string    `json:"model"`
	Messages []Message `json:"messages"`
	// MaxTokens bounds the completion, in tokens. Nil means DefaultCompletionTokens.
	MaxTokens *int `json:"max_tokens,omitempty"`
	// MaxCompletionTokens is OpenAI's newer name for MaxTokens; when set it takes precedence.
	MaxCompletionTokens *int `json:"max_completion_tokens,omitempty"`
	// Temperature in [0, 2]; 0 is greedy decoding. Nil means DefaultTemperature.
	Temperature *float64 `json:"temperature,omitempty"`
	// TopP in (0, 1], nucleus sampling. Nil means DefaultTopP.
	TopP *float64 `json:"top_p,omitempty"`
	// Seed selects the sampling stream. Nil means seed 0: a request without a seed is as
	// deterministic as one with it, which the mesh relies on to verify and resume streams.
	Seed *int64 `json:"seed,omitempty"`
	// Stop ends the completion at the first occurrence of any of these strings, which is
	// not included in the output.
	Stop StopList `json:"stop,omitempty"`
	// Stream asks the API for server-sent events instead of one JSON body. Backends always
	// stream; this only changes how the API answers.
	Stream bool `json:"stream,omitempty"`
	// Prefs are the routing preferences, resolved by the API (body, headers, node
	// defaults). They steer this node's router and never travel to a peer.
	Prefs Prefs `json:"-"`
	// Replay, on a request that continues a cut stream, holds the ids of the tokens the
	// client already has, in order: a backend that can, prefills them with the prompt in
	// one batch instead of generating them again, then samples on as the uninterrupted run
	// would have. Either way a backend emits every token from index 0 (the replayed ones
	// first), so one that ignores Replay (an upstream API, which streams text, not ids)
	// gives the same stream for a deterministic model, only later. Fewer than the
	// completion budget, none negative (Validate). The executor sets it when it resumes a
	// stream (node/dispatch); the OpenAI API never reads it from a client, and the peer
	// protocol carries it (transport/infer).
	Replay []int `json:"-"`
	// Move, when set, lets the generation be handed over live to another node (live
	// transfer, handover.go): on the serving node, where the cache's rows go when the node
	// leaves; on the requesting node, where the rows a leaving peer sends go. The peer
	// protocol carries only that it is set (transport/infer).
	Move *Move `json:"-"`
}

// EffectiveMaxTokens is the completion budget: MaxCompletionTokens if set, else MaxTokens if
// set, else DefaultCompletionTokens.
func (r *Request) EffectiveMaxTokens() int {
	switch {
	case r.MaxCompletionTokens != nil:
		return *r.MaxCompletionTokens
	case r.MaxTokens != nil:
		return *r.MaxTokens
	}
	return DefaultCompletionTokens
}

// Bounds a requester sets on what a serving peer returns (see transport/infer's client).
const (
	// MaxBytesPerToken bounds the average text of a completion token, in bytes: the longest
	// tokens of real vocabularies (runs of spaces, long words) are tens of bytes, and an
	// upstream that streams several tokens in one chunk still sends one chunk per token at
	// most, so 128 bytes each on average is far above any honest output.
	MaxBytesPerToken = 128
	// completionSlack is added to the completion's byte bound, in bytes: room for a short
	// completion made of unusually long tokens.
	completionSlack = 4 << 10
	// promptTokensPerMessage bounds the tokens a chat template adds around each message
	// (role markers, separators); real templates add under ten.
	promptTokensPerMessage = 16
)

// MaxCompletionBytes bounds the text of r's completion, in bytes: EffectiveMaxTokens ×
// MaxBytesPerToken plus 4 KiB. A serving peer that sends more is misbehaving.
func (r *Request) MaxCompletionBytes() int {
	return r.EffectiveMaxTokens()*MaxBytesPerToken + completionSlack
}

// PromptTokensBound is the most prompt tokens r can honestly count: every token is at least
// one byte of text, plus promptTokensPerMessage for each message's template and one more
// message's worth for the assistant's turn. A requester takes a peer's prompt count up to
// this bound and no further.
func (r *Request) PromptTokensBound() int {
	n := promptTokensPerMessage
	for _, m := range r.Messages {
		n += len(m.Content) + promptTokensPerMessage
	}
	return n
}

// BoundUsage is u as far as r makes it believable: the prompt count up to
// PromptTokensBound, the completion count up to EffectiveMaxTokens, negative counts as 0,
// and the total their sum. A requester that could not count a completion itself (a
// coordinator whose client got the tokens straight from the peer) bills no more than this.
func (r *Request) BoundUsage(u Usage) Usage {
	prompt := min(max(u.PromptTokens, 0), r.PromptTokensBound())
	completion := min(max(u.CompletionTokens, 0), r.EffectiveMaxTokens())
	return Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

// UnfinishedUsage is what a requester bills for r when it ended without a completed answer
// (the client hung up, the target failed): the completion tokens delivered, as counted (up
// to EffectiveMaxTokens), and the prompt at PromptTokensBound. A backend reports its prompt
// count only with a completed answer, so nobody counted this prompt; the bound is the most
// a completed answer could have been billed for it, which leaves a client nothing to gain by
// hanging up before the end.
func (r *Request) UnfinishedUsage(delivered int) Usage {
	return r.BoundUsage(Usage{PromptTokens: r.PromptTokensBound(), CompletionTokens: delivered})
}

// EffectiveTemperature is Temperature, or DefaultTemperature when absent.
func (r *Request) EffectiveTemperature() float64 {
	if r.Temperature != nil {
		return *r.Temperature
	}
	return DefaultTemperature
}

// EffectiveTopP is TopP, or DefaultTopP when absent.
func (r *Request) EffectiveTopP() float64 {
	if r.TopP != nil {
		return *r.TopP
	}
	return DefaultTopP
}

// EffectiveSeed is Seed, or 0 when absent.
func (r *Request) EffectiveSeed() int64 {
	if r.Seed != nil {
		return *r.Seed
	}
	return 0
}

// Limits bounds the requests a node accepts. A zero (or negative) field means its default,
// so Limits{} is the default set; DefaultLimits spells it out.
type Limits struct {
	// MaxBodyBytes bounds an encoded request (HTTP body or peer frame), in bytes; default
	// 256 KiB. Validate cannot see the encoding: the reader enforces it, reading at most this
	// plus a few bytes.
	MaxBodyBytes int64
	// MaxMessages bounds len(Messages); default 256.
	MaxMessages int
	// MaxContentBytes bounds the sum of len(Content) over all messages, in bytes; default
	// 192 KiB, under the body cap to leave room for the JSON around it.
	MaxContentBytes int
	// MaxTokens bounds max_tokens and max_completion_tokens, in tokens; default 4096, beyond
	// what a CPU backend produces in minutes.
	MaxTokens int
	// MaxModelBytes bounds len(Model), in bytes; default 256 (names are short identifiers).
	MaxModelBytes int
	// MaxStopBytes bounds each stop string, in bytes; default 256 (stops are short markers).
	MaxStopBytes int
}

// Default limits; see the fields of Limits for the reasons. The body cap is what one chat
// turn with a long document needs while a flood of maximal bodies still costs a node little.
const (
	defaultMaxBodyBytes    = 256 << 10 // bytes
	defaultMaxMessages     = 256
	defaultMaxContentBytes = 192 << 10 // bytes
	defaultMaxTokens       = 4096      // tokens
	defaultMaxModelBytes   = 256       // bytes
	defaultMaxStopBytes    = 256       // bytes
)

// NoSizeLimits makes Validate check only meaning (roles, ranges, UTF-8), not size. Backends
// use it: sizes are the API's and the peer protocol's policy, and a backend's own bound is
// its context window (or its upstream's limits).
func NoSizeLimits() Limits {
	return Limits{
		MaxMessages:     math.MaxInt,
		MaxContentBytes: math.MaxInt,
		MaxTokens:       math.MaxInt,
		MaxModelBytes:   math.MaxInt,
		MaxStopBytes:    math.MaxInt,
	}
}

// DefaultLimits returns the default limits with every field spelled out.
func DefaultLimits() Limits {
	return Limits{}.withDefaults()
}

func (l Limits) withDefaults() Limits {
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = defaultMaxBodyBytes
	}
	if l.MaxMessages <= 0 {
		l.MaxMessages = defaultMaxMessages
	}
	if l.MaxContentBytes <= 0 {
		l.MaxContentBytes = defaultMaxContentBytes
	}
	if l.MaxTokens <= 0 {
		l.MaxTokens = defaultMaxTokens
	}
	if l.MaxModelBytes <= 0 {
		l.MaxModelBytes = defaultMaxModelBytes
	}
	if l.MaxStopBytes <= 0 {
		l.MaxStopBytes = defaultMaxStopBytes
	}
	return l
}

// Validate checks r against limits (zero fields meaning their defaults) and OpenAI's fixed
// ranges. It returns nil or an *Error with CodeInvalidRequest naming the first problem found:
// an empty or oversized model name; no messages, too many, or too much content; an unknown
// role; max_tokens or max_completion_tokens outside [1, limits.MaxTokens]; temperature outside
// [0, 2]; top_p outside (0, 1]; more than MaxStop stop strings, or an empty or oversized one;
// text that is not valid UTF-8 (JSON decoding never produces it, Go callers might).
func (r *Request) Validate(limits Limits) error {
	l := limits.withDefaults()
	switch {
	case r.Model == "" && r.Prefs.Route != RouteAuto:
		return invalid("model is required (or ask the router to choose with route auto)")
	case len(r.Model) > l.MaxModelBytes:
		return invalid("model name is %d bytes, limit %d", len(r.Model), l.MaxModelBytes)
	case !utf8.ValidString(r.Model):
		return invalid("model name is not valid UTF-8")
	case len(r.Messages) == 0:
		return invalid("messages must not be empty")
	case len(r.Messages) > l.MaxMessages:
		return invalid("%d messages, limit %d", len(r.Messages), l.MaxMessages)
	}
	total := 0
	for i, m := range r.Messages {
		switch m.Role {
		case RoleSystem, RoleDeveloper, RoleUser, RoleAssistant:
		default:
			return invalid("messages[%d]: unknown role %q", i, m.Role)
		}
		if !utf8.ValidString(m.Content) {
			return invalid("messages[%d]: content is not valid UTF-8", i)
		}
		total += len(m.Content)
		if total > l.MaxContentBytes {
			return invalid("message content exceeds %d bytes", l.MaxContentBytes)
		}
	}
	if err := checkTokens("max_tokens", r.MaxTokens, l.MaxTokens); err != nil {
		return err
	}
	if err := checkTokens("max_completion_tokens", r.MaxCompletionTokens, l.MaxTokens); err != nil {
		return err
	}
	// The comparisons are written so that NaN fails them.
	if t := r.Temperature; t != nil && !(*t >= MinTemperature && *t <= MaxTemperature) {
		return invalid("temperature must be in [%g, %g], got %g", MinTemperature, MaxTemperature, *t)
	}
	if p := r.TopP; p != nil && !(*p > 0 && *p <= 1) {
		return invalid("top_p must be in (0, 1], got %g", *p)
	}
	if n := len(r.Replay); n > 0 && n >= r.EffectiveMaxTokens() {
		return invalid("%d tokens to replay leave none of the completion's %d to generate", n, r.EffectiveMaxTokens())
	}
	for _, id := range r.Replay {
		if id < 0 {
			return invalid("token id %d cannot be replayed", id)
		}
	}
	if len(r.Stop) > MaxStop {
		return invalid("%d stop strings, limit %d", len(r.Stop), MaxStop)
	}
	for i, s := range r.Stop {
		switch {
		case s == "":
			return invalid("stop[%d] is empty", i)
		case len(s) > l.MaxStopBytes:
			return invalid("stop[%d] is %d bytes, limit %d", i, len(s), l.MaxStopBytes)
		case !utf8.ValidString(s):
			return invalid("stop[%d] is not valid UTF-8", i)
		}
	}
	return nil
}

func checkTokens(field string, v *int, limit int) error {
	if v != nil && (*v < 1 || *v > limit) {
		return invalid("%s must be in [1, %d], got %d", field, limit, *v)
	}
	return nil
}

func invalid(format string, args ...any) *Error {
	return Errorf(CodeInvalidRequest, format, args...)
}
