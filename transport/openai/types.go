package openai

import (
	"context"
	"encoding/json"

	"github.com/meshinfer/meshinfer/inference"
)

// Dispatcher serves requests; node implements it with the router. It never sees a
// local-only request: those go to Local.
type Dispatcher interface {
	// Models lists every model reachable from this node, each with where it is served.
	Models(ctx context.Context) []Model
	// Generate serves req. emit receives each token with where it is being served; Generate
	// returns where the terminal outcome came from (Route "" when nothing could be tried).
	// Contract as inference.Backend: exactly one return, emit never after return, contiguous
	// indices (a stream resumed on another target continues the indices).
	Generate(ctx context.Context, req *inference.Request, emit func(at inference.Served, t inference.Token) error) (inference.Result, inference.Served, error)
}

// Local serves local-only requests on this device's backend. Whatever implements it must
// hold no network handle: it is the privacy gate's whole code path.
type Local interface {
	Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error)
}

// Model is one model reachable from this node.
type Model struct {
	ID     string   `json:"id"`
	Warm   bool     `json:"warm"`   // warm somewhere
	Routes []string `json:"routes"` // e.g. ["local", "peer:12D3KooW..."]
	// Deterministic: this node serves the model deterministically wherever it routes it
	// (the built-in models): the same request gives the same tokens every time.
	Deterministic bool `json:"deterministic"`
}

// chatRequest is the body of POST /v1/chat/completions: the fields the mesh acts on
// (inference.Request), the meshinfer extension object, and the few fields that only change
// how this API answers. Every other field is ignored.
type chatRequest struct {
	inference.Request
	// Meshinfer is the request's own preferences, the first source of Request.Prefs. Unknown
	// keys inside the object are ignored (later versions add some).
	Meshinfer meshinferObject `json:"meshinfer,omitzero"`
	// StreamOptions is OpenAI's stream_options; only include_usage is honoured.
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
	// N is OpenAI's number of choices. Only 1 is served; anything else is refused rather than
	// silently answered with one choice.
	N *int `json:"n,omitempty"`
}

// meshinferObject is the body's meshinfer object: the preferences as strings. Timeout is
// a Go duration ("30s"), read by inference.ParseTimeout; it shadows Prefs.Timeout, which
// has no JSON form.
type meshinferObject struct {
	inference.Prefs
	Timeout string `json:"timeout,omitempty"`
}

// checked is o's preferences: an unknown value, or a timeout not of inference.ParseTimeout's
// form, is an invalid_request naming the accepted ones.
func (o meshinferObject) checked() (inference.Prefs, *inference.Error) {
	p := o.Prefs
	err := p.Validate()
	if err == nil {
		p.Timeout, err = inference.ParseTimeout(o.Timeout)
	}
	if err != nil {
		return inference.Prefs{}, invalidf("meshinfer object: %s", message(err))
	}
	return p, nil
}

// BodyPrefs is the preferences the meshinfer object of a chat completion body gives,
// checked as the API checks them, without headers or defaults: for a body that reaches
// the node another way than the API, as a coordinator's direct tasks do.
func BodyPrefs(body []byte) (inference.Prefs, error) {
	var req struct {
		Meshinfer meshinferObject `json:"meshinfer"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return inference.Prefs{}, invalidf("meshinfer object: %v", err)
	}
	p, e := req.Meshinfer.checked()
	if e != nil {
		return inference.Prefs{}, e
	}
	return p, nil
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// servedInfo is the meshinfer extension object of a response: where it was served.
type servedInfo struct {
	Route    string `json:"route"`
	Tier     string `json:"tier"`
	Attempts int    `json:"attempts"`
	// Transport is how the serving peer was reached (libp2p or webrtc); mesh tier only.
	Transport inference.Transport `json:"transport,omitempty"`
}

func newServedInfo(at inference.Served) servedInfo {
	return servedInfo{Route: at.Route(), Tier: string(at.Tier), Attempts: at.Attempts, Transport: at.Transport}
}

// completion is the non-streaming response (object "chat.completion").
type completion struct {
	ID        string             `json:"id"`
	Object    string             `json:"object"`
	Created   int64              `json:"created"`
	Model     string             `json:"model"`
	Choices   []completionChoice `json:"choices"`
	Usage     inference.Usage    `json:"usage"`
	Meshinfer servedInfo         `json:"meshinfer"`
}

type completionChoice struct {
	Index        int                    `json:"index"`
	Message      assistantMessage       `json:"message"`
	FinishReason inference.FinishReason `json:"finish_reason"`
}

type assistantMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chunk is one streamed event (object "chat.completion.chunk") other than a token's, which
// sse.go encodes from a precomputed template (see tokenChunk).
type chunk struct {
	ID        string           `json:"id"`
	Object    string           `json:"object"`
	Created   int64            `json:"created"`
	Model     string           `json:"model"`
	Choices   []chunkChoice    `json:"choices"`
	Usage     *inference.Usage `json:"usage,omitempty"`
	Meshinfer *servedInfo      `json:"meshinfer,omitempty"`
}

type chunkChoice struct {
	Index        int                     `json:"index"`
	Delta        delta                   `json:"delta"`
	FinishReason *inference.FinishReason `json:"finish_reason"` // null until the final chunk
}

type delta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// modelList is the body of GET /v1/models.
type modelList struct {
	Object string        `json:"object"`
	Data   []modelObject `json:"data"`
}

// modelObject is one entry of GET /v1/models, and the body of GET /v1/models/{id}.
type modelObject struct {
	ID        string    `json:"id"`
	Object    string    `json:"object"`
	Created   int64     `json:"created"`
	OwnedBy   string    `json:"owned_by"`
	Meshinfer modelMesh `json:"meshinfer"`
}

type modelMesh struct {
	Warm          bool     `json:"warm"`
	Routes        []string `json:"routes"`
	Deterministic bool     `json:"deterministic"`
}

// errorBody is OpenAI's error JSON.
type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"` // always null: messages name the field instead
	Code    string  `json:"code"`
}

// Wire constants of OpenAI's API.
const (
	objectList       = "list"
	objectModel      = "model"
	objectCompletion = "chat.completion"
	objectChunk      = "chat.completion.chunk"
	ownedBy          = "meshinfer"
	roleAssistant    = inference.RoleAssistant
	idPrefix         = "chatcmpl-"
)
