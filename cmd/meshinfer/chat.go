package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/sse"
	"github.com/meshinfer/meshinfer/mesh/probe"
	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/gateway/client"
	"github.com/meshinfer/meshinfer/transport/gateway/client/direct"
)

const chatSynopsis = `Send one chat message to a node's OpenAI-compatible API and stream the answer.

  meshinfer chat "hello there"
  meshinfer chat --model synth-small --max-tokens 64 "tell me something"
  meshinfer chat --privacy local-only "this prompt never leaves this machine"

Through a coordinator's gateway, as a thin client with an API key (WebSocket, falling back to
REST; a lost connection is resumed without repeating or losing tokens):

  meshinfer chat --gateway https://coordinator:9337 --key msk_live_... "hello there"
  MESHINFER_API_KEY=msk_live_... meshinfer chat --gateway https://coordinator:9337 "hi"

Through a gateway, chat names this device to the coordinator, which records it with the
request's usage: a device id ("dev_" and 32 hex digits) derived from the machine's hardware
facts hashed with a random salt kept in device.json in --data-dir. It stays the same across
runs, differs between data dirs, and tells nothing about the hardware. --device sends
another id, --no-device none.

The built-in synthetic models produce meaningless text: they exist to exercise the mesh
(real compute, real streaming, deterministic output), not to answer.`

// maxSSELine bounds one server-sent event line (a chunk is a few hundred bytes).
const maxSSELine = 1 << 20

// apiKeyEnv holds the API key for --gateway when --key is not given: a key in a flag shows in
// the process list and the shell's history.
const apiKeyEnv = "MESHINFER_API_KEY"

func runChat(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("chat [flags] PROMPT", chatSynopsis, stderr)
	api := fs.String("api", "http://127.0.0.1:9337", "the node's API base URL (host:port alone means http://host:port)")
	model := fs.String("model", "synth-tiny", "model to use (GET /v1/models lists them)")
	maxTokens := fs.Int("max-tokens", 64, "most tokens to generate")
	seed := fs.Int64("seed", 0, "sampling seed (same seed, same prompt: same answer)")
	privacy := fs.String("privacy", "", "local-only, mesh or any (default: the node's --privacy)")
	priority := fs.String("priority", "", "cost, latency or balanced (default: the node's --priority)")
	timeout := fs.Duration("timeout", 0, "the request's time limit, e.g. 30s or 2m, at most 1h: the node ends it with a timeout error when it passes (with --direct, chat does), and its router counts it as the time a moved generation has left (default: none)")
	gatewayURL := fs.String("gateway", "", "a coordinator's API base URL: chat through its gateway as a thin client, with --key (instead of --api)")
	key := fs.String("key", "", "API key for --gateway (default $"+apiKeyEnv+")")
	device := fs.String("device", "", "with --gateway: send this device id (e.g. a UUID) instead of the one derived and kept in --data-dir")
	noDevice := fs.Bool("no-device", false, "with --gateway: send no device id")
	dataDir := fs.String("data-dir", "", "with --gateway: where this device's id is kept, "+node.DeviceFile+" (default $XDG_DATA_HOME/meshinfer, else ~/.local/share/meshinfer)")
	allowHTTP := fs.Bool("allow-http", false, "with --gateway: send the API key over plain http:// to another machine (only on a network you trust; https:// needs no flag)")
	useDirect := fs.Bool("direct", false, "with --gateway: get the tokens over a WebRTC data channel straight from the serving peer; the coordinator only routes and meters")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	prompt := strings.Join(fs.Args(), " ")
	if prompt == "" {
		fmt.Fprintln(stderr, "meshinfer chat: give a prompt, e.g. meshinfer chat \"hello\"")
		return errUsage
	}
	if *gatewayURL == "" && (*key != "" || *device != "" || *noDevice || *dataDir != "" || *useDirect || *allowHTTP) {
		fmt.Fprintln(stderr, "meshinfer chat: --key, --device, --no-device, --data-dir, --direct and --allow-http go with --gateway URL")
		return errUsage
	}
	if *noDevice && (*device != "" || *dataDir != "") {
		fmt.Fprintln(stderr, "meshinfer chat: --no-device sends no device id: leave out --device and --data-dir")
		return errUsage
	}
	if *device != "" && *dataDir != "" {
		fmt.Fprintln(stderr, "meshinfer chat: --device sends the id given, not the one kept in --data-dir: give one of them")
		return errUsage
	}
	prefs := inference.Prefs{Privacy: inference.Privacy(*privacy), Priority: inference.Priority(*priority), Timeout: *timeout}
	if err := prefs.Validate(); err != nil { // the node would refuse them; say so before sending
		fmt.Fprintf(stderr, "meshinfer chat: %v\n", err)
		return errUsage
	}
	if *useDirect && prefs.Privacy == inference.PrivacyLocalOnly {
		fmt.Fprintln(stderr, "meshinfer chat: --direct gets the tokens from a mesh peer, which --privacy local-only forbids: leave out one of them")
		return errUsage
	}
	if *useDirect && prefs.Priority != "" && prefs.Priority != inference.PriorityLatency {
		fmt.Fprintf(stderr, "meshinfer chat: note: a direct task goes to the peer quickest to answer; --priority %s is not sent\n", prefs.Priority)
	}
	if *gatewayURL != "" && *key == "" {
		if *key = os.Getenv(apiKeyEnv); *key == "" {
			fmt.Fprintf(stderr, "meshinfer chat: --gateway needs an API key: --key KEY or $%s (the coordinator's operator creates one with 'meshinfer keys create')\n", apiKeyEnv)
			return errUsage
		}
	}
	if *gatewayURL != "" && *device == "" && !*noDevice {
		*device = derivedDevice(*dataDir, stderr)
	}
	if !strings.Contains(*api, "://") {
		*api = "http://" + *api // as printed by 'meshinfer testnet' and 'meshinfer node'
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cr := chatRequest{model: *model, prompt: prompt, maxTokens: *maxTokens, seed: *seed, privacy: *privacy, priority: *priority}
	if *timeout != 0 {
		cr.timeout = timeout.String() // a Go duration, as the API reads it
	}
	onText := func(s string) { fmt.Fprint(stdout, s) }
	var (
		out chatOutcome
		err error
	)
	switch {
	case *gatewayURL != "" && *useDirect:
		// A direct task has no time limit at the coordinator: this client keeps it.
		dctx, ended := timeLimited(ctx, *timeout)
		out, err = chatDirect(dctx, *gatewayURL, *key, *device, *allowHTTP, cr, onText)
		err = ended(err)
		if errors.Is(err, direct.ErrNoChannel) {
			fmt.Fprintf(stderr, "meshinfer chat: %v; sending it through the gateway instead\n", err)
			if end, ok := dctx.Deadline(); ok { // what is left of --timeout, not all of it again
				cr.timeout = max(time.Until(end).Round(time.Millisecond), time.Millisecond).String()
			}
			out, err = chatGateway(ctx, *gatewayURL, *key, *device, *allowHTTP, cr, onText)
		}
	case *gatewayURL != "":
		out, err = chatGateway(ctx, *gatewayURL, *key, *device, *allowHTTP, cr, onText)
	default:
		out, err = chat(ctx, *api, cr, onText)
	}
	if errors.Is(err, gateway.ErrPlainHTTPKey) {
		err = fmt.Errorf("%w; for a network you trust: --allow-http", err)
	}
	fmt.Fprintln(stdout)
	if err != nil {
		return err
	}
	var via string
	if out.transport != "" {
		via = " via the gateway (" + out.transport + ")"
	}
	tier := out.tier + " tier"
	if out.peerLink != "" {
		tier += " over " + out.peerLink
	}
	if *gatewayURL != "" && *device != "" {
		via += ", device " + *device
	}
	fmt.Fprintf(stderr, "[%s, %d tokens, finish %s, served by %s (%s, %d attempt(s))%s]\n",
		*model, out.tokens, out.finish, out.route, tier, out.attempts, via)
	return nil
}

// derivedDevice returns this machine's device id for the data dir dir (default when ""):
// derived from its hardware facts and the salt kept there, made on first use
// (node.LoadOrCreateDevice). When it cannot be had, chat says why and sends none: the
// request does not need one.
func derivedDevice(dir string, stderr io.Writer) string {
	dir, err := dataDirOrDefault(dir)
	var d node.Device
	if err == nil {
		d, err = node.LoadOrCreateDevice(dir, probe.ReadDeviceFacts(probe.DefaultRoot))
	}
	if err != nil {
		fmt.Fprintf(stderr, "meshinfer chat: sending no device id: %v (--no-device leaves it out without this note)\n", err)
		return ""
	}
	if d.Previous != "" {
		fmt.Fprintf(stderr, "meshinfer chat: this device's id is now %s, was %s: its hardware differs from when %s was written (or the data dir was copied from another machine)\n",
			d.ID, d.Previous, filepath.Join(dir, node.DeviceFile))
	}
	return d.ID
}

// chatDirect streams one completion from the serving peer over a WebRTC data channel, set
// up through a coordinator's gateway (transport/gateway/client/direct).
func chatDirect(ctx context.Context, base, key, device string, plainHTTP bool, cr chatRequest, onText func(string)) (chatOutcome, error) {
	body := map[string]any{
		"model":      cr.model,
		"messages":   []map[string]string{{"role": "user", "content": cr.prompt}},
		"max_tokens": cr.maxTokens,
		"seed":       cr.seed,
	}
	res, err := direct.Chat(ctx, base, key, body, direct.Options{PlainHTTP: plainHTTP, Device: device, OnToken: func(t inference.Token) { onText(t.Text) }})
	if err != nil {
		return chatOutcome{}, fmt.Errorf("direct through %s: %w", base, err)
	}
	return chatOutcome{route: res.Peer, tier: "mesh", attempts: 1, finish: string(res.FinishReason),
		tokens: res.Tokens, transport: "webrtc direct, metered from the peer's receipt"}, nil
}

// timeLimited is ctx ending after limit (none when 0), and a function that turns the error
// of a call made with it into the node's own (inference.TimeLimitPassed) when the limit is
// what ended it.
func timeLimited(ctx context.Context, limit time.Duration) (context.Context, func(error) error) {
	if limit <= 0 {
		return ctx, func(err error) error { return err }
	}
	passed := inference.TimeLimitPassed(limit)
	ctx, cancel := context.WithTimeoutCause(ctx, limit, passed)
	return ctx, func(err error) error {
		defer cancel()
		if err != nil && errors.Is(context.Cause(ctx), passed) {
			return passed
		}
		return err
	}
}

// chatGateway streams one completion through a coordinator's gateway with the Go thin
// client: WebSocket, or REST when the coordinator has no WebSocket endpoint.
func chatGateway(ctx context.Context, base, key, device string, plainHTTP bool, cr chatRequest, onText func(string)) (chatOutcome, error) {
	opts := []client.Option{client.WithDevice(device)}
	if plainHTTP {
		opts = append(opts, client.WithPlainHTTP())
	}
	c := client.New(base, key, opts...)
	defer c.Close()
	body := map[string]any{
		"model":      cr.model,
		"messages":   []map[string]string{{"role": "user", "content": cr.prompt}},
		"max_tokens": cr.maxTokens,
		"seed":       cr.seed,
	}
	if cr.privacy != "" || cr.priority != "" || cr.timeout != "" {
		body["meshinfer"] = map[string]string{"privacy": cr.privacy, "priority": cr.priority, "timeout": cr.timeout}
	}
	res, err := c.Chat(ctx, body, func(t client.Token) { onText(t.Text) })
	if err != nil {
		_, refused := errors.AsType[*client.Error](err)
		if !refused && !errors.Is(err, context.Canceled) && !errors.Is(err, client.ErrReplayMismatch) && !errors.Is(err, client.ErrProtocol) {
			return chatOutcome{}, fmt.Errorf("gateway %s: %w\nis the coordinator running, and is --gateway its API's URL?", base, err)
		}
		return chatOutcome{}, fmt.Errorf("gateway %s: %w", base, err)
	}
	return chatOutcome{route: res.Route, tier: res.Tier, attempts: res.Attempts, finish: res.FinishReason,
		tokens: res.Tokens, transport: res.Transport}, nil
}

type chatOutcome struct {
	route     string // the final route (a resumed stream may end elsewhere than it began)
	tier      string
	attempts  int
	finish    string
	tokens    int
	transport string // through a gateway: websocket or rest; "" otherwise
	peerLink  string // how the node reached the serving peer: libp2p or webrtc; "" off the mesh
}

// chatRequest is one chat completion to send; empty privacy and priority leave the node's
// defaults, an empty timeout sets no time limit.
type chatRequest struct {
	model, prompt     string
	maxTokens         int
	seed              int64
	privacy, priority string
	timeout           string // a Go duration: X-Meshinfer-Timeout, or the meshinfer object's timeout
	// onStart, if set, is called by chat once the node accepted the stream, with where its
	// first attempt runs (X-Meshinfer-Route).
	onStart func(route string)
}

// chat streams one completion from api, calling onText with each piece of text.
func chat(ctx context.Context, api string, cr chatRequest, onText func(string)) (chatOutcome, error) {
	body, _ := json.Marshal(map[string]any{
		"model":      cr.model,
		"messages":   []map[string]string{{"role": "user", "content": cr.prompt}},
		"max_tokens": cr.maxTokens,
		"seed":       cr.seed,
		"stream":     true,
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(api, "/")+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return chatOutcome{}, fmt.Errorf("--api %q: %w", api, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if cr.privacy != "" {
		req.Header.Set("X-Meshinfer-Privacy", cr.privacy)
	}
	if cr.priority != "" {
		req.Header.Set("X-Meshinfer-Priority", cr.priority)
	}
	if cr.timeout != "" {
		req.Header.Set("X-Meshinfer-Timeout", cr.timeout)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return chatOutcome{}, fmt.Errorf("cannot reach the API: %w\nis a node running? start one with 'meshinfer node', or point --api at it", err)
	}
	defer resp.Body.Close()
	out := chatOutcome{route: resp.Header.Get("X-Meshinfer-Route"), tier: resp.Header.Get("X-Meshinfer-Tier")}
	out.attempts, _ = strconv.Atoi(resp.Header.Get("X-Meshinfer-Attempts"))
	if resp.StatusCode != http.StatusOK {
		return out, apiError(resp)
	}
	if cr.onStart != nil {
		cr.onStart(out.route)
	}
	sr := sse.NewReader(resp.Body, maxSSELine)
	for {
		data, err := sr.Next()
		if errors.Is(err, io.EOF) { // [DONE]
			return out, nil
		}
		if errors.Is(err, sse.ErrNoDone) {
			return out, fmt.Errorf("stream ended without [DONE]")
		}
		if err != nil {
			return out, fmt.Errorf("stream broke: %w", err)
		}
		var ev struct {
			Choices []struct {
				Delta        struct{ Content string } `json:"delta"`
				FinishReason *string                  `json:"finish_reason"`
			} `json:"choices"`
			Meshinfer *struct {
				Route, Tier, Transport string
				Attempts               int
			} `json:"meshinfer"`
			Error *struct{ Message, Code string } `json:"error"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			return out, fmt.Errorf("bad event from the API: %w", err)
		}
		if ev.Error != nil {
			return out, fmt.Errorf("stream ended with %s: %s", ev.Error.Code, ev.Error.Message)
		}
		if m := ev.Meshinfer; m != nil {
			out.route, out.tier, out.attempts, out.peerLink = m.Route, m.Tier, m.Attempts, m.Transport
		}
		for _, c := range ev.Choices {
			if c.Delta.Content != "" {
				out.tokens++
				onText(c.Delta.Content)
			}
			if c.FinishReason != nil {
				out.finish = *c.FinishReason
			}
		}
	}
}

func apiError(resp *http.Response) error {
	var e struct {
		Error struct{ Message, Code string } `json:"error"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, &e) == nil && e.Error.Code != "" {
		return fmt.Errorf("%s (%s): %s", resp.Status, e.Error.Code, e.Error.Message)
	}
	return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
}
