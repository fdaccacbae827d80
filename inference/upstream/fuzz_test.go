package upstream_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/upstream"
)

// bodyTransport answers every request with 200 and a fixed body, with no network in between:
// the fuzzer's bytes go straight into the stream parser through Generate.
type bodyTransport []byte

func (b bodyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{
		StatusCode: http.StatusOK,
		Header:     http.Header{"Content-Type": {"text/event-stream"}},
		Body:       io.NopCloser(bytes.NewReader(b)),
		Request:    r,
	}, nil
}

// FuzzSSE feeds arbitrary response bodies to Generate: it never panics, emits contiguous
// non-empty tokens, and ends with a finish reason or a typed error of the closed set.
func FuzzSSE(f *testing.F) {
	for _, seed := range []string{
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n" +
			"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\ndata: [DONE]\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"length\"}]}\r\n\r\ndata:[DONE]\r\n",
		"data: {\"error\":{\"message\":\"busy\",\"code\":\"overloaded\"}}\n\n",
		"data: {\"error\":\"boom\"}\n\n",
		": comment\nevent: x\nid: 1\nretry: 5\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"\xff\xfe\"}}]}\n",
		"data: {nope\n",
		"",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := upstream.New("http://fuzz.invalid", []string{"m"},
			upstream.WithHTTPClient(&http.Client{Transport: bodyTransport(body)}))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		req := inference.Request{Model: "m", Messages: []inference.Message{{Role: inference.RoleUser, Content: "hi"}}}
		n := 0
		res, err := b.Generate(context.Background(), &req, func(tok inference.Token) error {
			if tok.Index != n || tok.Text == "" || tok.ID != -1 || len(tok.Text) > 1<<10 {
				t.Fatalf("token %+v after %d tokens", tok, n)
			}
			n++
			return nil
		})
		if err != nil {
			if _, ok := inference.ParseCode(string(inference.CodeOf(err))); !ok || res != (inference.Result{}) {
				t.Fatalf("Generate = %+v, %v: want the zero result and a typed error", res, err)
			}
			return
		}
		if res.FinishReason != inference.FinishStop && res.FinishReason != inference.FinishLength {
			t.Fatalf("finish reason %q", res.FinishReason)
		}
	})
}
