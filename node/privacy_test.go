package node

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// testCloud is a real OpenAI-compatible server over the synthetic backend that counts the
// chat requests (and their body bytes) it receives.
type testCloud struct {
	b              *synth.Backend
	requests, body atomic.Int64
}

func (c *testCloud) Models(context.Context) []openai.Model { return nil }

func (c *testCloud) Generate(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
	c.requests.Add(1)
	at := inference.Served{Tier: inference.TierLocal, Attempts: 1}
	res, err := c.b.Generate(ctx, req, func(t inference.Token) error { return emit(at, t) })
	return res, at, err
}

// connCounter counts connections the host makes or accepts.
type connCounter struct {
	network.NoopNotifiee
	n atomic.Int64
}

func (c *connCounter) Connected(network.Network, network.Conn) { c.n.Add(1) }

// Local-only requests never reach the network: over thousands of them (served, refused,
// cancelled mid-stream, oversized, malformed), the executor counts no
// request, the peer and the cloud no request, the host makes no connection and the
// announcer publishes nothing. A mesh request at the end shows the counters do count.
func TestLocalOnlyNeverTouchesTheNetwork(t *testing.T) {
	sb, err := synth.New("synth-tiny")
	if err != nil {
		t.Fatal(err)
	}
	cloud := &testCloud{b: sb}
	cloudSrv, err := openai.New("127.0.0.1:0", cloud)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cloudSrv.Close() })

	// No periodic publish inside the test, however slow the machine: 2,000 requests under
	// -race on a loaded 2-core machine have taken over a minute.
	const heartbeat = 3 * time.Minute // the longest a vector's 10 min lifetime allows
	b := startTestNode(t, Config{Models: []string{"synth-small"}, Heartbeat: heartbeat})
	a := startTestNode(t, Config{
		Models: []string{"synth-tiny"}, Heartbeat: heartbeat,
		Bootstrap: []peer.AddrInfo{b.AddrInfo()},
		CloudURL:  "http://" + cloudSrv.Addr(), CloudModels: []string{"synth-tiny"},
	})
	within(t, 15*time.Second, "A and B see each other's announcements", func() bool {
		ea, okA := a.Registry().Get(b.ID(), time.Now())
		eb, okB := b.Registry().Get(a.ID(), time.Now())
		return okA && okB && !ea.Stale && !eb.Stale
	})

	// The announcer may still owe one publish from the join (it coalesces triggers at least
	// a second apart): wait until its count holds still for longer than that gap, so that a
	// publish during the requests could only come from them.
	quietFor, last, since := 2500*time.Millisecond, a.announcer.Published(), time.Now()
	for deadline := since.Add(10 * time.Second); time.Since(since) < quietFor; {
		if time.Now().After(deadline) {
			t.Fatal("announcer never went quiet")
		}
		time.Sleep(50 * time.Millisecond)
		if p := a.announcer.Published(); p != last {
			last, since = p, time.Now()
		}
	}

	conns := &connCounter{}
	a.Host().Network().Notify(conns)
	published, bServed := a.announcer.Published(), b.infer.Stats()

	api := "http://" + a.APIAddr() + "/v1/chat/completions"
	post := func(ctx context.Context, body string, header http.Header) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api, strings.NewReader(body))
		for k, v := range header {
			req.Header[k] = v
		}
		return http.DefaultClient.Do(req)
	}
	body := func(model string, stream bool, inBody bool) string {
		prefs := ""
		if inBody {
			prefs = `,"meshinfer":{"privacy":"local-only"}`
		}
		return fmt.Sprintf(`{"model":%q,"max_tokens":4,"stream":%v,"messages":[{"role":"user","content":"hi"}]%s}`, model, stream, prefs)
	}
	viaHeader := http.Header{"X-Meshinfer-Privacy": {"local-only"}}
	oversized := `{"model":"synth-tiny","meshinfer":{"privacy":"local-only"},"messages":[{"role":"user","content":"` +
		strings.Repeat("x", 300<<10) + `"}]}`

	const requests = 2000
	counts := map[string]int{}
	for i := range requests {
		var (
			resp *http.Response
			err  error
			want int
			kind string
		)
		switch i % 7 {
		case 0:
			kind, want = "served, streaming", 200
			resp, err = post(context.Background(), body("synth-tiny", true, true), nil)
		case 1:
			kind, want = "served, header", 200
			resp, err = post(context.Background(), body("synth-tiny", false, false), viaHeader)
		case 2:
			kind, want = "model only a peer serves", http.StatusServiceUnavailable
			resp, err = post(context.Background(), body("synth-small", false, true), nil)
		case 3:
			kind, want = "model nobody serves", http.StatusServiceUnavailable
			resp, err = post(context.Background(), body("synth-none", true, false), viaHeader)
		case 4:
			kind = "cancelled mid-stream"
			ctx, cancel := context.WithCancel(context.Background())
			resp, err = post(ctx, body("synth-tiny", true, true), nil)
			if err == nil {
				bufio.NewReader(resp.Body).ReadString('\n') // the first event, then hang up
				cancel()
				resp.Body.Close()
				counts[kind]++
				continue
			}
			cancel()
		case 5:
			kind, want = "oversized", http.StatusRequestEntityTooLarge
			resp, err = post(context.Background(), oversized, nil)
		case 6:
			kind, want = "malformed", http.StatusBadRequest
			resp, err = post(context.Background(), `{"model":"synth-tiny","messages":[`, viaHeader)
		}
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s: status %d, want %d", kind, resp.StatusCode, want)
		}
		if want == 200 && resp.Header.Get("X-Meshinfer-Route") != "local" {
			t.Fatalf("%s: route %q", kind, resp.Header.Get("X-Meshinfer-Route"))
		}
		counts[kind]++
	}
	t.Logf("local-only requests by kind: %v", counts)

	if n := cloud.requests.Load(); n != 0 {
		t.Errorf("the cloud received %d requests", n)
	}
	if st := b.infer.Stats(); st.Served+st.Failed+st.Overloaded+st.ProtocolErrors != bServed.Served+bServed.Failed+bServed.Overloaded+bServed.ProtocolErrors {
		t.Errorf("peer B saw requests: %+v, before %+v", st, bServed)
	}
	if n := conns.n.Load(); n != 0 {
		t.Errorf("host made or accepted %d connections", n)
	}
	if p := a.announcer.Published(); p != published {
		t.Errorf("announcer published %d times", p-published)
	}
	st := a.Status().Routing
	if rq := st.Requests; rq.Local+rq.Mesh+rq.Cloud+rq.NoTarget != 0 {
		t.Errorf("local-only requests reached the router: %+v", rq)
	}
	if st.LocalOnly.Served == 0 || st.LocalOnly.Refused == 0 {
		t.Errorf("gate counters %+v: want served and refused requests", st.LocalOnly)
	}

	// The counters count: a mesh request goes through the peer client to B.
	resp, err := post(context.Background(), body("synth-small", false, false), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if mesh := a.Status().Routing.Requests.Mesh; resp.StatusCode != 200 || mesh != 1 {
		t.Fatalf("mesh request: status %d, mesh requests %d", resp.StatusCode, mesh)
	}
	// B counts the request served just after its terminal frame leaves, which may be after
	// the client has its answer.
	within(t, 5*time.Second, "B counts the mesh request", func() bool { return b.infer.Stats().Served == bServed.Served+1 })
	t.Logf("figure F14: local-only requests %v: 0 connections, 0 publishes, 0 peer or cloud requests, 0 reaching the router", counts)
}
