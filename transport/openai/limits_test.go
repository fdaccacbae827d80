package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
)

// paddedBody is a valid request padded with trailing whitespace to exactly size bytes.
func paddedBody(t testing.TB, size int64) []byte {
	t.Helper()
	req := testRequest()
	req.MaxTokens = ptr(2)
	b := body(t, req, false, false)
	if int64(len(b)) > size {
		t.Fatalf("request is %d bytes, over %d", len(b), size)
	}
	return append(b, bytes.Repeat([]byte{' '}, int(size)-len(b))...)
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// sendBody posts b, announcing its length or (chunked) not.
func sendBody(c *http.Client, addr string, b []byte, chunked bool) (int, []byte, http.Header, error) {
	var r io.Reader = bytes.NewReader(b)
	if chunked {
		r = struct{ io.Reader }{r} // hides the length: the transport sends chunks
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", r)
	if err != nil {
		return 0, nil, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("POST %d bytes (chunked %v): %w", len(b), chunked, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, resp.Header, err
}

// TestBodyLimit: a body of exactly MaxBodyBytes is served, one byte more is refused with 413,
// whether the body announces its length or is chunked.
func TestBodyLimit(t *testing.T) {
	limit := inference.DefaultLimits().MaxBodyBytes
	s := startServer(t, newDispatcher(t))
	c := newClient(t)
	for _, chunked := range []bool{false, true} {
		status, b, _, err := sendBody(c, s.Addr(), paddedBody(t, limit), chunked)
		if err != nil || status != http.StatusOK {
			t.Errorf("chunked %v: body of exactly %d bytes: status %d (%v): %s", chunked, limit, status, err, b)
		}
		status, b, h, err := sendBody(c, s.Addr(), paddedBody(t, limit+1), chunked)
		if err != nil {
			t.Fatalf("chunked %v: %v", chunked, err)
		}
		if status != http.StatusRequestEntityTooLarge {
			t.Fatalf("chunked %v: body of %d bytes: status %d, want 413: %s", chunked, limit+1, status, b)
		}
		if e := decodeError(t, status, h, b); e.Code != string(inference.CodeInvalidRequest) {
			t.Errorf("chunked %v: 413 with code %q, want invalid_request", chunked, e.Code)
		}
	}
}

// TestBodyLimitReads counts what the handler reads of an over-limit body of unknown length:
// at most the limit plus 16 bytes (docs/reliability.md L6).
func TestBodyLimitReads(t *testing.T) {
	var most int64                              // bytes read beyond the limit
	for _, limit := range []int64{0, 1 << 10} { // 0: the default, 256 KiB
		eff := limit
		if eff == 0 {
			eff = inference.DefaultLimits().MaxBodyBytes
		}
		h := Handler(newDispatcher(t), WithLimits(inference.Limits{MaxBodyBytes: limit}))
		for _, size := range []int64{eff + 1, eff + 100, 10 * eff} {
			cr := &countingReader{r: bytes.NewReader(paddedBody(t, size))}
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", cr) // length unknown
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusRequestEntityTooLarge {
				t.Errorf("limit %d, body %d: status %d, want 413", eff, size, w.Code)
			}
			if cr.n > eff+16 {
				t.Errorf("limit %d, body %d: read %d bytes, want at most %d", eff, size, cr.n, eff+16)
			}
			most = max(most, cr.n-eff)
			decodeError(t, w.Code, w.Header(), w.Body.Bytes())
		}
		// An announced length over the limit is refused before reading anything.
		cr := &countingReader{r: bytes.NewReader(paddedBody(t, eff+1))}
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", cr)
		r.ContentLength = eff + 1
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusRequestEntityTooLarge || cr.n != 0 {
			t.Errorf("limit %d, Content-Length %d: status %d after reading %d bytes, want 413 after 0", eff, eff+1, w.Code, cr.n)
		}
	}
	t.Logf("figure L6: over-limit bodies of unknown length refused (413) after reading at most the limit + %d bytes", most)
}

// TestMaxSizeBodiesConcurrent is docs/reliability.md L6 over a real connection: 32 concurrent
// requests of exactly the limit all finish; 32 of the limit plus one byte are all refused.
func TestMaxSizeBodiesConcurrent(t *testing.T) {
	const n = 32
	limit := inference.DefaultLimits().MaxBodyBytes
	s := startServer(t, newDispatcher(t))
	c := newClient(t)
	atLimit, overLimit := paddedBody(t, limit), paddedBody(t, limit+1)
	var wg sync.WaitGroup
	errs := make(chan string, 2*n)
	for i := range 2 * n {
		wg.Go(func() {
			over := i%2 == 1
			b := atLimit
			if over {
				b = overLimit
			}
			status, out, _, err := sendBody(c, s.Addr(), b, i%4 >= 2)
			switch {
			case err != nil:
				errs <- fmt.Sprintf("request %d: %v", i, err)
			case over && status != http.StatusRequestEntityTooLarge:
				errs <- fmt.Sprintf("request %d over the limit: status %d", i, status)
			case !over && status != http.StatusOK:
				errs <- fmt.Sprintf("request %d at the limit: status %d: %s", i, status, out)
			case !over:
				var got wireCompletion
				if err := json.Unmarshal(out, &got); err != nil || len(got.Choices) != 1 || got.Choices[0].FinishReason == "" {
					errs <- fmt.Sprintf("request %d: bad completion %s", i, out)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	t.Logf("figure L6: %d concurrent bodies at the %d KiB limit all finished (200, a finish reason); %d one byte over all 413", n, limit>>10, n)
}
