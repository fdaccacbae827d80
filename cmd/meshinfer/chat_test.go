package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// coordinator is a coordinator node the tests chat through.
type coordinator struct {
	api, key, dir string // its API's URL, an API key and its data dir
	node          *node.Node
}

// startCoordinator starts a coordinator node on loopback that serves synth-tiny, with an API
// key made by `meshinfer keys create`. It is closed when the test ends.
func startCoordinator(t *testing.T) coordinator {
	t.Helper()
	dir := t.TempDir()
	key, _ := createKeyCmd(t, dir, "laptop")
	id, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	consent := participation.Consent{Version: participation.ConsentVersion, RunLocal: true, Contribute: true}
	n, err := node.New(node.Config{Identity: id, DataDir: dir, Consent: &consent, Models: []string{"synth-tiny"},
		Roles: []node.Role{node.RoleCoordinator}, Loopback: true, ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"},
		ConsoleAddr: node.ConsoleOff, APIAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return coordinator{api: "http://" + n.APIAddr(), key: key, dir: dir, node: n}
}

// chatReference is what `meshinfer chat --max-tokens n --seed s PROMPT` must print: the
// synthetic backend's completion of the same request.
func chatReference(t *testing.T, prompt string, maxTokens int, seed int64) string {
	t.Helper()
	b, err := synth.New("synth-tiny")
	if err != nil {
		t.Fatal(err)
	}
	req := inference.Request{Model: "synth-tiny", Messages: []inference.Message{{Role: inference.RoleUser, Content: prompt}},
		MaxTokens: &maxTokens, Seed: &seed}
	var text strings.Builder
	if _, err := b.Generate(context.Background(), &req, func(tok inference.Token) error {
		text.WriteString(tok.Text)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return text.String()
}

// chat --gateway streams through a coordinator's gateway with the key from --key or
// $MESHINFER_API_KEY, and refuses to run without a key or with a bad one.
func TestChatThroughGateway(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir()) // where chat keeps its device id by default
	c := startCoordinator(t)
	api, key := c.api, c.key
	want := chatReference(t, "hello mesh", 12, 3) + "\n"

	code, stdout, stderr := runCmd(t, "chat", "--gateway", api, "--key", key, "--device", "laptop-1",
		"--max-tokens", "12", "--seed", "3", "hello", "mesh")
	if code != 0 || stdout != want {
		t.Fatalf("chat --gateway --key: exit %d\nstdout %q, want %q\nstderr %q", code, stdout, want, stderr)
	}
	wantContains(t, "chat --gateway stderr", stderr, "served by local", "via the gateway (websocket)")

	t.Setenv(apiKeyEnv, key)
	if code, stdout, stderr = runCmd(t, "chat", "--gateway", api, "--max-tokens", "12", "--seed", "3", "hello mesh"); code != 0 || stdout != want {
		t.Fatalf("chat --gateway with $%s: exit %d\nstdout %q, want %q\nstderr %q", apiKeyEnv, code, stdout, want, stderr)
	}

	code, _, stderr = runCmd(t, "chat", "--gateway", api, "--key", "msk_live_nope", "hi")
	if code != 1 || !strings.Contains(stderr, "401") || !strings.Contains(stderr, "invalid_api_key") {
		t.Fatalf("chat with a bad key: exit %d, stderr %q", code, stderr)
	}
	// Without --gateway, chat talks to --api as before: a coordinator's API wants a key.
	if code, _, stderr = runCmd(t, "chat", "--api", api, "hi"); code != 1 || !strings.Contains(stderr, "invalid_api_key") {
		t.Fatalf("chat --api to a coordinator: exit %d, stderr %q", code, stderr)
	}

	t.Setenv(apiKeyEnv, "")
	if code, _, stderr = runCmd(t, "chat", "--gateway", api, "hi"); code != 2 || !strings.Contains(stderr, apiKeyEnv) {
		t.Fatalf("chat --gateway without a key: exit %d, stderr %q", code, stderr)
	}
	for _, args := range [][]string{
		{"chat", "--key", key, "hi"},
		{"chat", "--data-dir", t.TempDir(), "hi"},
		{"chat", "--no-device", "hi"},
		{"chat", "--gateway", api, "--key", key, "--no-device", "--device", "laptop-1", "hi"},
		{"chat", "--gateway", api, "--key", key, "--data-dir", t.TempDir(), "--device", "laptop-1", "hi"},
	} {
		if code, _, stderr = runCmd(t, args...); code != 2 {
			t.Fatalf("%q: exit %d, want 2\nstderr %q", args, code, stderr)
		}
	}
}

// chatDevice is the device id `meshinfer chat` said it sent, "" if it named none.
func chatDevice(stderr string) string {
	_, after, ok := strings.Cut(stderr, ", device ")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(after, "]")
	return id
}

// chat --gateway sends the device id kept in --data-dir (made on the first run, the same on
// the next; a record holding another id is told and updated; a record others can read is
// not used, with a note), --device another one and --no-device none; the coordinator
// meters each request under the device it named and `meshinfer usage --by-device` shows
// them apart. A device id the gateway refuses fails the command with the coordinator's
// reason.
func TestChatSendsTheDeviceID(t *testing.T) {
	c := startCoordinator(t)
	api, key := c.api, c.key
	clientDir := filepath.Join(t.TempDir(), "client")
	chatArgs := func(extra ...string) []string {
		return append([]string{"chat", "--gateway", api, "--key", key, "--max-tokens", "4"}, append(extra, "hi")...)
	}
	var ids []string
	for i := range 2 {
		code, _, stderr := runCmd(t, chatArgs("--data-dir", clientDir)...)
		if code != 0 {
			t.Fatalf("chat %d: exit %d\n%s", i, code, stderr)
		}
		ids = append(ids, chatDevice(stderr))
	}
	data, err := os.ReadFile(filepath.Join(clientDir, node.DeviceFile))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct{ ID string }
	if err := json.Unmarshal(data, &rec); err != nil || !node.ValidDeviceID(rec.ID) || ids[0] != rec.ID || ids[1] != rec.ID {
		t.Fatalf("chat named devices %q, %s holds %s (%v): want its id both times", ids, node.DeviceFile, data, err)
	}
	path := filepath.Join(clientDir, node.DeviceFile)
	// A record holding another id (the hardware changed since): chat says so and sends
	// the id of today's hardware, which the record then holds.
	if err := os.WriteFile(path, bytes.Replace(data, []byte(rec.ID), []byte("dev_00000000000000000000000000000000"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCmd(t, chatArgs("--data-dir", clientDir)...)
	if code != 0 || chatDevice(stderr) != rec.ID {
		t.Fatalf("chat with a changed id: exit %d, stderr %q", code, stderr)
	}
	wantContains(t, "chat with a changed id", stderr, "id is now "+rec.ID+", was dev_00000000000000000000000000000000")
	if now, err := os.ReadFile(path); err != nil || !bytes.Equal(now, data) {
		t.Fatalf("%s holds %s after the change, want %s (%v)", node.DeviceFile, now, data, err)
	}
	// A record others could read is not used: chat says why, sends no id, and still runs.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCmd(t, chatArgs("--data-dir", clientDir)...)
	if code != 0 || chatDevice(stderr) != "" {
		t.Fatalf("chat with a record others can read: exit %d, stderr %q", code, stderr)
	}
	wantContains(t, "chat with a record others can read", stderr, "sending no device id", "chmod 600", "--no-device")
	code, _, stderr = runCmd(t, chatArgs("--no-device")...)
	if code != 0 || chatDevice(stderr) != "" || strings.Contains(stderr, "device") {
		t.Fatalf("chat --no-device: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCmd(t, chatArgs("--device", "my laptop")...)
	if code != 1 {
		t.Fatalf("chat --device 'my laptop': exit %d, want 1\nstderr %q", code, stderr)
	}
	wantContains(t, "chat with a malformed device", stderr, "400", "invalid_request", "X-Meshinfer-Device")

	// Metering runs just after each response; the node's Close waits for it.
	if err := c.node.Close(); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCmd(t, "usage", "--data-dir", c.dir, "--by-device", "--json")
	var rep usageReport
	if code != 0 || json.Unmarshal([]byte(stdout), &rep) != nil {
		t.Fatalf("usage --by-device --json: exit %d\n%s\n%s", code, stdout, stderr)
	}
	got := map[string]int{}
	for _, r := range rep.Keys {
		if r.Device == nil {
			t.Fatalf("usage --by-device row without a device: %+v", r)
		}
		got[*r.Device] += r.Requests
	}
	if want := map[string]int{rec.ID: 3, "": 2}; !maps.Equal(got, want) || rep.Total.Requests != 5 {
		t.Fatalf("usage --by-device: requests by device %v (total %d), want %v", got, rep.Total.Requests, want)
	}
	code, stdout, _ = runCmd(t, "usage", "--data-dir", c.dir, "--by-device")
	if code != 0 {
		t.Fatalf("usage --by-device: exit %d", code)
	}
	wantContains(t, "usage --by-device", stdout, "DEVICE", rec.ID)
}

// chat --gateway refuses to send a key over plain http:// to another machine, with and
// without --direct, and says how to proceed; nothing is dialed.
func TestChatRefusesPlainHTTPKey(t *testing.T) {
	for _, args := range [][]string{
		{"chat", "--gateway", "http://coordinator.invalid:9337", "--key", "msk_live_x", "hi"},
		{"chat", "--gateway", "http://coordinator.invalid:9337", "--key", "msk_live_x", "--direct", "hi"},
	} {
		code, _, stderr := runCmd(t, args...)
		if code != 1 {
			t.Errorf("%q: exit %d, want 1\nstderr %q", args, code, stderr)
		}
		wantContains(t, "stderr", stderr, "plain http://", "https://", "--allow-http")
	}
}

// deadlineAPI is a Dispatcher over the synthetic backend that records the deadline of each
// request's context: the time limit chat asked for, as the API applied it.
type deadlineAPI struct {
	b *synth.Backend

	mu   sync.Mutex
	left []time.Duration // per request: its deadline less the time Generate began; -1 for none
}

func (d *deadlineAPI) Models(context.Context) []openai.Model {
	return []openai.Model{{ID: "synth-tiny", Routes: []string{"local"}}}
}

func (d *deadlineAPI) Generate(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
	left := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	d.mu.Lock()
	d.left = append(d.left, left)
	d.mu.Unlock()
	at := inference.Served{Tier: inference.TierLocal, Attempts: 1}
	res, err := d.b.Generate(ctx, req, func(t inference.Token) error { return emit(at, t) })
	return res, at, err
}

// chat --timeout sends X-Meshinfer-Timeout: the API gives the request that deadline; none
// without the flag; a limit the API refuses is an error naming the header and the bound.
func TestChatTimeout(t *testing.T) {
	b, err := synth.New("synth-tiny")
	if err != nil {
		t.Fatal(err)
	}
	d := &deadlineAPI{b: b}
	srv := httptest.NewServer(openai.Handler(d))
	defer srv.Close()
	want := chatReference(t, "hello mesh", 6, 0) + "\n"

	for _, args := range [][]string{{"--timeout", "30s"}, nil} {
		args = append(append([]string{"chat", "--api", srv.URL, "--max-tokens", "6"}, args...), "hello", "mesh")
		if code, stdout, stderr := runCmd(t, args...); code != 0 || stdout != want {
			t.Fatalf("%q: exit %d\nstdout %q, want %q\nstderr %q", args, code, stdout, want, stderr)
		}
	}
	d.mu.Lock()
	left := slices.Clone(d.left)
	d.mu.Unlock()
	if len(left) != 2 || left[0] <= 0 || left[0] > 30*time.Second || left[1] != -1 {
		t.Fatalf("time left at the dispatcher %v, want (0, 30s] with --timeout 30s, then none (-1)", left)
	}
	// Preferences the node would refuse are refused before anything is sent.
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"--timeout", "2h"}, []string{"timeout 2h0m0s", "at most 1h"}},
		{[]string{"--timeout", "-5s"}, []string{"timeout -5s", "at most 1h"}},
		{[]string{"--privacy", "everywhere"}, []string{`privacy "everywhere"`, "local-only, mesh, any"}},
		{[]string{"--priority", "fast"}, []string{`priority "fast"`, "cost, latency, balanced"}},
		{[]string{"--gateway", srv.URL, "--key", "msk_live_x", "--no-device", "--direct", "--privacy", "local-only"},
			[]string{"--direct", "--privacy local-only"}},
	} {
		args := append(append([]string{"chat", "--api", srv.URL}, tt.args...), "hi")
		code, _, stderr := runCmd(t, args...)
		if code != 2 {
			t.Fatalf("%q: exit %d, want 2\nstderr %q", args, code, stderr)
		}
		wantContains(t, fmt.Sprintf("%q stderr", args), stderr, tt.want...)
	}
	d.mu.Lock()
	n := len(d.left)
	d.mu.Unlock()
	if n != 2 {
		t.Fatalf("a refused preference reached the dispatcher (%d requests)", n)
	}
}

// timeLimited turns the error of a call its limit ended into the node's timeout error, and
// leaves other errors, and calls without a limit, as they are.
func TestTimeLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, ended := timeLimited(context.Background(), 30*time.Second)
		<-ctx.Done()
		err := ended(fmt.Errorf("direct: %w", ctx.Err()))
		if inference.CodeOf(err) != inference.CodeTimeout || err.Error() != "timeout: the request's 30s time limit passed" {
			t.Fatalf("after the limit: %v, want the timeout error naming 30s", err)
		}
		other := errors.New("the peer left")
		_, ended = timeLimited(context.Background(), time.Minute)
		if err := ended(other); err != other {
			t.Fatalf("before the limit: %v, want the call's own error", err)
		}
		if err := ended(nil); err != nil {
			t.Fatalf("a call that ended well: %v", err)
		}
		plain, ended := timeLimited(context.Background(), 0)
		if _, ok := plain.Deadline(); ok || ended(other) != other {
			t.Fatalf("no limit: the context has a deadline, or the error changed")
		}
	})
}
