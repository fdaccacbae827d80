package inference

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

func validRequest() Request {
	return Request{
		Model:    "synth-tiny",
		Messages: []Message{{Role: RoleSystem, Content: "be brief"}, {Role: RoleUser, Content: "hi"}},
	}
}

func TestValidate(t *testing.T) {
	small := Limits{MaxMessages: 2, MaxContentBytes: 10, MaxTokens: 100, MaxModelBytes: 12, MaxStopBytes: 3}
	tests := []struct {
		name   string
		mutate func(*Request)
		limits Limits
		ok     bool
	}{
		{"valid", func(r *Request) {}, Limits{}, true},
		{"all fields", func(r *Request) {
			r.MaxTokens, r.Temperature, r.TopP, r.Seed = ptr(10), ptr(0.7), ptr(0.9), ptr[int64](-3)
			r.Stop, r.Stream = []string{"a", "b", "c", "d"}, true
		}, Limits{}, true},
		{"every role", func(r *Request) {
			r.Messages = []Message{{RoleSystem, ""}, {RoleDeveloper, "x"}, {RoleUser, "y"}, {RoleAssistant, "z"}}
		}, Limits{}, true},
		{"empty model", func(r *Request) { r.Model = "" }, Limits{}, false},
		{"model too long", func(r *Request) { r.Model = "synth-tiny-xx" }, small, false},
		{"no messages", func(r *Request) { r.Messages = nil }, Limits{}, false},
		{"empty messages", func(r *Request) { r.Messages = []Message{} }, Limits{}, false},
		{"unknown role", func(r *Request) { r.Messages[1].Role = "tool" }, Limits{}, false},
		{"role case", func(r *Request) { r.Messages[1].Role = "User" }, Limits{}, false},
		{"too many messages", func(r *Request) { r.Messages = append(r.Messages, Message{RoleUser, ""}) }, small, false},
		{"messages at limit", func(r *Request) {}, small, true},
		{"content over limit", func(r *Request) { r.Messages[1].Content = "abc" }, small, false},
		{"content at limit", func(r *Request) { r.Messages[0].Content = "12345678" }, small, true},
		{"content bad utf8", func(r *Request) { r.Messages[1].Content = "\xff" }, Limits{}, false},
		{"replay within the budget", func(r *Request) { r.MaxTokens, r.Replay = ptr(3), []int{5, 0} }, Limits{}, true},
		{"replay of the whole budget", func(r *Request) { r.MaxTokens, r.Replay = ptr(2), []int{5, 6} }, Limits{}, false},
		{"replay of a negative id", func(r *Request) { r.Replay = []int{5, -1} }, Limits{}, false},
		{"max_tokens 0", func(r *Request) { r.MaxTokens = ptr(0) }, Limits{}, false},
		{"max_tokens negative", func(r *Request) { r.MaxTokens = ptr(-1) }, Limits{}, false},
		{"max_tokens at limit", func(r *Request) { r.MaxTokens = ptr(100) }, small, true},
		{"max_tokens over limit", func(r *Request) { r.MaxTokens = ptr(101) }, small, false},
		{"max_tokens over default", func(r *Request) { r.MaxTokens = ptr(4097) }, Limits{}, false},
		{"max_completion_tokens 0", func(r *Request) { r.MaxCompletionTokens = ptr(0) }, Limits{}, false},
		{"max_completion_tokens over", func(r *Request) { r.MaxCompletionTokens = ptr(101) }, small, false},
		{"temperature 0", func(r *Request) { r.Temperature = ptr(0.0) }, Limits{}, true},
		{"temperature 2", func(r *Request) { r.Temperature = ptr(2.0) }, Limits{}, true},
		{"temperature negative", func(r *Request) { r.Temperature = ptr(-0.1) }, Limits{}, false},
		{"temperature over 2", func(r *Request) { r.Temperature = ptr(2.01) }, Limits{}, false},
		{"temperature NaN", func(r *Request) { r.Temperature = ptr(math.NaN()) }, Limits{}, false},
		{"top_p 1", func(r *Request) { r.TopP = ptr(1.0) }, Limits{}, true},
		{"top_p 0", func(r *Request) { r.TopP = ptr(0.0) }, Limits{}, false},
		{"top_p over 1", func(r *Request) { r.TopP = ptr(1.5) }, Limits{}, false},
		{"top_p NaN", func(r *Request) { r.TopP = ptr(math.NaN()) }, Limits{}, false},
		{"five stops", func(r *Request) { r.Stop = []string{"a", "b", "c", "d", "e"} }, Limits{}, false},
		{"empty stop", func(r *Request) { r.Stop = []string{""} }, Limits{}, false},
		{"stop too long", func(r *Request) { r.Stop = []string{"abcd"} }, small, false},
		{"stop bad utf8", func(r *Request) { r.Stop = []string{"\xc3"} }, Limits{}, false},
	}
	for _, tt := range tests {
		r := validRequest()
		tt.mutate(&r)
		err := r.Validate(tt.limits)
		if tt.ok && err != nil {
			t.Errorf("%s: Validate = %v, want nil", tt.name, err)
		}
		if !tt.ok && CodeOf(err) != CodeInvalidRequest {
			t.Errorf("%s: Validate = %v, want an invalid_request error", tt.name, err)
		}
	}
}

func TestDefaultLimits(t *testing.T) {
	want := Limits{MaxBodyBytes: 256 << 10, MaxMessages: 256, MaxContentBytes: 192 << 10,
		MaxTokens: 4096, MaxModelBytes: 256, MaxStopBytes: 256}
	if got := DefaultLimits(); got != want {
		t.Errorf("DefaultLimits() = %+v, want %+v", got, want)
	}
}

func TestEffectiveDefaults(t *testing.T) {
	var r Request
	if r.EffectiveMaxTokens() != DefaultCompletionTokens || r.EffectiveTemperature() != 1 ||
		r.EffectiveTopP() != 1 || r.EffectiveSeed() != 0 {
		t.Errorf("defaults = %d %g %g %d", r.EffectiveMaxTokens(), r.EffectiveTemperature(), r.EffectiveTopP(), r.EffectiveSeed())
	}
	r.MaxTokens = ptr(7)
	if got := r.EffectiveMaxTokens(); got != 7 {
		t.Errorf("EffectiveMaxTokens with max_tokens 7 = %d", got)
	}
	r.MaxCompletionTokens = ptr(9)
	if got := r.EffectiveMaxTokens(); got != 9 {
		t.Errorf("EffectiveMaxTokens with max_completion_tokens 9 = %d", got)
	}
}

func TestRequestJSON(t *testing.T) {
	body := `{"model":"m","messages":[
		{"role":"system","content":null},
		{"role":"user","content":[{"type":"text","text":"hel"},{"type":"text","text":"lo"}]},
		{"role":"assistant","content":"ok","name":"ignored"}],
		"max_tokens":5,"max_completion_tokens":6,"temperature":0.5,"top_p":0.25,"seed":-9,
		"stop":"END","stream":true,"n":1,"stream_options":{"include_usage":true}}`
	var r Request
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	want := Request{
		Model:     "m",
		Messages:  []Message{{RoleSystem, ""}, {RoleUser, "hello"}, {RoleAssistant, "ok"}},
		MaxTokens: ptr(5), MaxCompletionTokens: ptr(6), Temperature: ptr(0.5), TopP: ptr(0.25),
		Seed: ptr[int64](-9), Stop: StopList{"END"}, Stream: true,
	}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("decoded %+v\nwant    %+v", r, want)
	}
	out, err := json.Marshal(r)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	for _, field := range []string{`"max_tokens":5`, `"max_completion_tokens":6`, `"top_p":0.25`, `"seed":-9`, `"stop":["END"]`, `"stream":true`} {
		if !strings.Contains(string(out), field) {
			t.Errorf("encoding %s lacks %s", out, field)
		}
	}
}

func TestStopListJSON(t *testing.T) {
	tests := []struct {
		in   string
		want StopList
		ok   bool
	}{
		{`"x"`, StopList{"x"}, true},
		{`["a","b"]`, StopList{"a", "b"}, true},
		{`[]`, nil, true},
		{`null`, nil, true},
		{`5`, nil, false},
		{`[1]`, nil, false},
	}
	for _, tt := range tests {
		var r Request
		err := json.Unmarshal([]byte(`{"stop":`+tt.in+`}`), &r)
		if (err == nil) != tt.ok {
			t.Errorf("stop %s: err = %v, want ok=%v", tt.in, err, tt.ok)
			continue
		}
		if tt.ok && !reflect.DeepEqual(r.Stop, tt.want) {
			t.Errorf("stop %s: got %#v, want %#v", tt.in, r.Stop, tt.want)
		}
	}
}

func TestMessageContentRejects(t *testing.T) {
	for _, in := range []string{
		`{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}`,
		`{"role":"user","content":5}`,
		`{"role":"user","content":{"text":"x"}}`,
	} {
		var m Message
		if err := json.Unmarshal([]byte(in), &m); err == nil {
			t.Errorf("Unmarshal(%s) = %+v, want an error", in, m)
		}
	}
}

// Route and ParseRoute are inverses, and ParseRoute refuses anything else.
func TestServedRoute(t *testing.T) {
	for _, s := range []Served{{Tier: TierLocal}, {Tier: TierCloud}, {Tier: TierMesh, Peer: "12D3KooWX"}} {
		got, ok := ParseRoute(s.Route())
		if !ok || !reflect.DeepEqual(got, s) {
			t.Errorf("ParseRoute(%q) = %+v, %v; want %+v", s.Route(), got, ok, s)
		}
	}
	for _, route := range []string{"", "peer:", "elsewhere", "mesh", "Local"} {
		if got, ok := ParseRoute(route); ok {
			t.Errorf("ParseRoute(%q) = %+v, want refused", route, got)
		}
	}
	if r := (Served{}).Route(); r != "" {
		t.Errorf("no attempt: route %q, want empty", r)
	}
}

// A peer's usage is believed only within what the request makes possible.
func TestBoundUsage(t *testing.T) {
	n := 16
	r := &Request{MaxTokens: &n, Messages: []Message{{Role: RoleUser, Content: "hello mesh"}}}
	bound := r.PromptTokensBound()
	if want := len("hello mesh") + 2*promptTokensPerMessage; bound != want {
		t.Fatalf("prompt bound %d, want %d", bound, want)
	}
	for _, tt := range []struct{ in, want Usage }{
		{Usage{PromptTokens: 5, CompletionTokens: 7}, Usage{PromptTokens: 5, CompletionTokens: 7, TotalTokens: 12}},
		{Usage{PromptTokens: 1_000_000, CompletionTokens: 1_000_000, TotalTokens: 1}, Usage{PromptTokens: bound, CompletionTokens: 16, TotalTokens: bound + 16}},
		{Usage{PromptTokens: -3, CompletionTokens: -1}, Usage{}},
	} {
		if got := r.BoundUsage(tt.in); got != tt.want {
			t.Errorf("BoundUsage(%+v) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
	if got, want := r.MaxCompletionBytes(), 16*MaxBytesPerToken+completionSlack; got != want {
		t.Errorf("MaxCompletionBytes = %d, want %d", got, want)
	}
}

// An unfinished request is billed the tokens delivered and the prompt's bound.
func TestUnfinishedUsage(t *testing.T) {
	n := 16
	r := &Request{MaxTokens: &n, Messages: []Message{{Role: RoleSystem, Content: "be brief"}, {Role: RoleUser, Content: "hello mesh"}}}
	bound := len("be brief") + len("hello mesh") + 3*promptTokensPerMessage
	for _, tt := range []struct {
		delivered int
		want      Usage
	}{
		{0, Usage{PromptTokens: bound, TotalTokens: bound}},
		{5, Usage{PromptTokens: bound, CompletionTokens: 5, TotalTokens: bound + 5}},
		{99, Usage{PromptTokens: bound, CompletionTokens: 16, TotalTokens: bound + 16}},
		{-1, Usage{PromptTokens: bound, TotalTokens: bound}},
	} {
		if got := r.UnfinishedUsage(tt.delivered); got != tt.want {
			t.Errorf("UnfinishedUsage(%d) = %+v, want %+v", tt.delivered, got, tt.want)
		}
	}
}

func TestPipelineRouteRoundTrip(t *testing.T) {
	s := Served{Tier: TierMesh, Stages: []StageHop{{Peer: "12D3KooWa", Lo: 0, Hi: 8}, {Peer: "12D3KooWb", Lo: 8, Hi: 16}}}
	route := s.Route()
	if route != "pipeline:12D3KooWa[0-7],12D3KooWb[8-15]" {
		t.Fatalf("Route = %q", route)
	}
	back, ok := ParseRoute(route)
	if !ok || len(back.Stages) != 2 || back.Stages[1] != s.Stages[1] || back.Tier != TierMesh {
		t.Fatalf("ParseRoute(%q) = %+v, %v", route, back, ok)
	}
	for _, bad := range []string{"pipeline:", "pipeline:a", "pipeline:a[3-1]", "pipeline:[0-1]", "pipeline:a[0-1]x"} {
		if _, ok := ParseRoute(bad); ok {
			t.Errorf("ParseRoute(%q) accepted", bad)
		}
	}
}
