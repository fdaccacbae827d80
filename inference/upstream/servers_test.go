package upstream_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
)

// canned answers every request with one fixed status and body, as other OpenAI-compatible
// servers (llama-server, vLLM, Ollama, OpenAI) answer in situations our API does not produce.
func canned(t testing.TB, status int, contentType, body string) string {
	t.Helper()
	return serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		w.Write([]byte(body))
	})).URL
}

// Error answers in the shapes other servers use map to the documented codes.
func TestOtherServersErrors(t *testing.T) {
	const js = "application/json"
	tests := []struct {
		name   string
		status int
		body   string
		want   inference.Code
		tokens int
	}{
		{"llama-server context size", 400, `{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}`, inference.CodeContextOverflow, 0},
		{"vLLM maximum context length", 400, `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","param":null,"code":400}`, inference.CodeContextOverflow, 0},
		{"OpenAI context_length_exceeded", 400, `{"error":{"message":"Too long.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`, inference.CodeContextOverflow, 0},
		{"other 400", 400, `{"error":{"message":"temperature is out of range","type":"invalid_request_error","code":null}}`, inference.CodeInvalidRequest, 0},
		{"400 with a bare string", 400, `{"error":"bad request"}`, inference.CodeInvalidRequest, 0},
		{"422", 422, `{"detail":[{"msg":"field required"}]}`, inference.CodeInvalidRequest, 0},
		{"401 bad key", 401, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`, inference.CodeUnavailable, 0},
		{"403", 403, `forbidden`, inference.CodeUnavailable, 0},
		{"Ollama model not found", 404, `{"error":{"message":"model \"llama3\" not found, try pulling it first","type":"api_error","param":null,"code":null}}`, inference.CodeModelNotFound, 0},
		{"404 wrong path", 404, "404 page not found\n", inference.CodeUnavailable, 0},
		{"408", 408, ``, inference.CodeTimeout, 0},
		{"429 rate limit", 429, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`, inference.CodeOverloaded, 0},
		{"500 html", 500, "<html><body>" + strings.Repeat("Internal Server Error ", 100) + "</body></html>", inference.CodeUnavailable, 0},
		{"502", 502, `bad gateway`, inference.CodeUnavailable, 0},
		{"503 loading model", 503, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`, inference.CodeUnavailable, 0},
		{"cut stream", 200, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n", inference.CodeUnavailable, 1},
		{"empty stream", 200, "", inference.CodeUnavailable, 0},
		{"a JSON body, not a stream", 200, `{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}`, inference.CodeUnavailable, 0},
		{"error event, foreign code", 200, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"oops\",\"code\":\"server_is_sad\"}}\n\n", inference.CodeUnavailable, 1},
		{"error event, numeric code", 200, "data: {\"error\":{\"message\":\"oops\",\"code\":500}}\n\n", inference.CodeUnavailable, 0},
		{"error event, typed code", 200, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"busy\",\"code\":\"overloaded\"}}\n\n", inference.CodeOverloaded, 1},
		{"error event, bare string", 200, "data: {\"error\":\"boom\"}\n\n", inference.CodeUnavailable, 0},
		{"error event, unreadable", 200, "data: {\"error\":5}\n\n", inference.CodeUnavailable, 0},
		{"malformed event", 200, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {nope\n\n", inference.CodeUnavailable, 1},
		{"line over 1 MiB", 200, "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 1<<20) + "\"}}]}\n\n", inference.CodeUnavailable, 0},
	}
	for _, tt := range tests {
		b := newBackend(t, canned(t, tt.status, js, tt.body), []string{testModel})
		r := generate(context.Background(), b, testRequest())
		if got := inference.CodeOf(r.err); got != tt.want {
			t.Errorf("%s: error %v (code %q), want code %q", tt.name, r.err, got, tt.want)
		}
		if len(r.tokens) != tt.tokens {
			t.Errorf("%s: %d tokens, want %d", tt.name, len(r.tokens), tt.tokens)
		}
		checkStream(t, r.tokens)
	}
}

// Streams in the shapes other servers send succeed with the documented result.
func TestOtherServersStreams(t *testing.T) {
	chunk := func(content, finish string) string {
		c := `{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":` + content + `},"finish_reason":` + finish + `}]}`
		return "data: " + c + "\n\n"
	}
	big := strings.Repeat("é", 1500) // 3000 bytes: cut into pieces of at most 1 KiB
	tests := []struct {
		name string
		body string
		text string
		res  inference.Result
		n    int // tokens emitted
	}{
		{"OpenAI, usage chunk", "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n" +
			chunk(`"Hel"`, "null") + chunk(`"lo"`, "null") + chunk(`null`, `"stop"`) +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\ndata: [DONE]\n\n",
			"Hello", inference.Result{FinishReason: inference.FinishStop, Usage: inference.Usage{PromptTokens: 9, CompletionTokens: 2, TotalTokens: 11}}, 2},
		{"vLLM, usage in the last chunk, length", chunk(`"a"`, "null") +
			"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\ndata: [DONE]\n\n",
			"ab", inference.Result{FinishReason: inference.FinishLength, Usage: inference.Usage{PromptTokens: 3, CompletionTokens: 2, TotalTokens: 5}}, 2},
		{"no usage: counted", chunk(`"a"`, "null") + chunk(`"b"`, "null") + chunk(`"c"`, `"stop"`),
			"abc", inference.Result{FinishReason: inference.FinishStop, Usage: inference.Usage{CompletionTokens: 3, TotalTokens: 3}}, 3},
		{"content_filter is stop", chunk(`"a"`, `"content_filter"`) + "data: [DONE]\n\n",
			"a", inference.Result{FinishReason: inference.FinishStop, Usage: inference.Usage{CompletionTokens: 1, TotalTokens: 1}}, 1},
		{"[DONE] without a finish reason is stop", chunk(`"a"`, "null") + "data:[DONE]\n\n",
			"a", inference.Result{FinishReason: inference.FinishStop, Usage: inference.Usage{CompletionTokens: 1, TotalTokens: 1}}, 1},
		{"CRLF, comments, event lines, other choices", ": keep-alive\r\n\r\nevent: message\r\nid: 1\r\n" +
			strings.ReplaceAll(chunk(`"a"`, "null"), "\n", "\r\n") +
			"data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"other\"}}]}\r\n\r\n" +
			strings.ReplaceAll(chunk(`"b"`, `"stop"`), "\n", "\r\n") + "data: [DONE]\r\n\r\n",
			"ab", inference.Result{FinishReason: inference.FinishStop, Usage: inference.Usage{CompletionTokens: 2, TotalTokens: 2}}, 2},
		{"big delta is cut", chunk(`"`+big+`"`, `"stop"`) + "data: [DONE]\n\n",
			big, inference.Result{FinishReason: inference.FinishStop, Usage: inference.Usage{CompletionTokens: 1, TotalTokens: 1}}, 3},
		{"nothing after [DONE] is read", chunk(`"a"`, `"stop"`) + "data: [DONE]\n\ndata: {nope\n\n",
			"a", inference.Result{FinishReason: inference.FinishStop, Usage: inference.Usage{CompletionTokens: 1, TotalTokens: 1}}, 1},
		{"no token at all", chunk(`""`, `"stop"`) + "data: [DONE]\n\n",
			"", inference.Result{FinishReason: inference.FinishStop}, 0},
	}
	for _, tt := range tests {
		b := newBackend(t, canned(t, 200, "text/event-stream", tt.body), []string{testModel})
		r := generate(context.Background(), b, testRequest())
		if r.err != nil {
			t.Errorf("%s: %v", tt.name, r.err)
			continue
		}
		checkStream(t, r.tokens)
		if got := strings.Join(r.texts(), ""); got != tt.text || r.res != tt.res {
			t.Errorf("%s: text %q result %+v, want %q %+v", tt.name, got, r.res, tt.text, tt.res)
		}
		if len(r.tokens) != tt.n {
			t.Errorf("%s: %d tokens, want %d", tt.name, len(r.tokens), tt.n)
		}
		for _, tok := range r.tokens {
			if len(tok.Text) > 1<<10 {
				t.Errorf("%s: token of %d bytes, want at most 1 KiB", tt.name, len(tok.Text))
			}
		}
	}
}
