package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/gateway/client"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// restartable is a coordinator in miniature that can crash and start again on the same
// address and data dir (keys, meter, idempotency records), as F13's coordinator restart.
type restartable struct {
	t    *testing.T
	dir  string
	key  string
	ks   *gateway.KeyStore
	addr string
	hold func(ctx context.Context, call int64) error

	srv   *httptest.Server
	conns *connTracker
	ws    *gateway.WebSocket
	meter *gateway.Meter
	d     *dispatcher
}

func newRestartable(t *testing.T, hold func(ctx context.Context, call int64) error) *restartable {
	t.Helper()
	dir := t.TempDir()
	ks, err := gateway.OpenKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := ks.Create("alice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	r := &restartable{t: t, dir: dir, key: key, ks: ks, addr: "127.0.0.1:0", hold: hold}
	r.start()
	t.Cleanup(r.crash)
	return r
}

// start serves on r.addr (the same port after a crash), reading back the data dir.
func (r *restartable) start() {
	r.t.Helper()
	var err error
	if r.meter, err = gateway.OpenMeter(r.dir); err != nil {
		r.t.Fatal(err)
	}
	b, err := synth.New(testModel)
	if err != nil {
		r.t.Fatal(err)
	}
	r.d = &dispatcher{b: b, meter: r.meter, hold: r.hold}
	api := openai.Handler(r.d)
	if r.ws, err = gateway.NewWebSocket(r.ks, api, gateway.WithRecords(r.dir, r.meter)); err != nil {
		r.t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(gateway.WebSocketPath, r.ws)
	mux.Handle("/", api)
	l, err := net.Listen("tcp", r.addr)
	if err != nil {
		r.t.Fatal(err)
	}
	r.addr = l.Addr().String()
	r.conns = &connTracker{Listener: l}
	r.srv = httptest.NewUnstartedServer(gateway.RequireKey(r.ks, mux))
	r.srv.Listener = r.conns
	r.srv.Start()
}

// crash cuts every connection at once, as the kernel does for a killed process, then
// stops what is left of the old coordinator (its runs, cancelled with nobody attached).
// Idempotent.
func (r *restartable) crash() {
	if r.srv == nil {
		return
	}
	r.conns.crash()
	r.ws.Close()
	r.srv.Close()
	r.meter.Close()
	r.srv = nil
}

// connTracker is a listener that can cut every connection it accepted, hijacked ones
// (WebSockets) included, which httptest.Server.CloseClientConnections leaves alone.
type connTracker struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *connTracker) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// crash closes the listener and every connection.
func (l *connTracker) crash() {
	l.Listener.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
}

// completedByRun counts the completed meter events of each gateway run in the data dir.
func (r *restartable) completedByRun() map[string]int {
	r.t.Helper()
	n := make(map[string]int)
	err := gateway.ReadEvents(filepath.Join(r.dir, gateway.UsageFile), func(e gateway.MeterEvent) {
		if e.Outcome == gateway.OutcomeCompleted {
			n[e.Idempotency]++
		}
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return n
}

// F13 in miniature: 20 requests in flight when the coordinator crashes. Restarted on the
// same address and data dir within the client's lost timeout, it gets every request back:
// each Chat call returns one completion, each request is metered completed once. Gone for
// good, every call returns coordinator_lost, once, and nothing more is metered.
func TestCoordinatorRestartEachCallEndsOnce(t *testing.T) {
	const calls = 20
	want, ref := reference(t, 13, 16)
	for _, restart := range []bool{true, false} {
		name := "restarted"
		if !restart {
			name = "gone"
		}
		t.Run(name, func(t *testing.T) {
			g := newGate()
			r := newRestartable(t, g.hold)
			c := client.New("http://"+r.addr, r.key, client.WithLostTimeout(time.Minute))
			if !restart {
				c = client.New("http://"+r.addr, r.key, client.WithLostTimeout(50*time.Millisecond))
			}
			defer c.Close()
			type outcome struct {
				res client.Result
				err error
				col *collector
			}
			out := make(chan outcome, calls)
			var wg sync.WaitGroup
			for range calls {
				wg.Go(func() {
					col := &collector{t: t}
					res, err := c.Chat(context.Background(), chatBody(13, 16), col.on)
					out <- outcome{res, err, col}
				})
			}
			for range calls {
				<-g.started // every request in flight, held
			}
			r.crash()
			if restart {
				r.hold = nil
				r.start()
			}
			wg.Wait()
			close(out)
			for o := range out {
				switch {
				case restart && o.err != nil:
					t.Fatalf("after a restart: %v", o.err)
				case restart:
					o.col.check(o.res, want, ref, client.TransportWebSocket)
				default:
					var e *client.Error
					if !errors.As(o.err, &e) || e.Code != string(inference.CodeCoordinatorLost) || len(o.col.tokens) != 0 {
						t.Fatalf("coordinator gone: %v after %d tokens, want coordinator_lost", o.err, len(o.col.tokens))
					}
				}
			}
			byRun := r.completedByRun()
			completed := 0
			for run, n := range byRun {
				if run == "" || n != 1 {
					t.Errorf("run %q metered completed %d times", run, n)
				}
				completed += n
			}
			if wantDone := map[bool]int{true: calls, false: 0}[restart]; completed != wantDone {
				t.Fatalf("%d requests metered completed, want %d", completed, wantDone)
			}
			t.Logf("figure F13: in process, coordinator %s: %d calls in flight at the crash, each ended once; %d metered completed, none twice", name, calls, completed)
		})
	}
}
