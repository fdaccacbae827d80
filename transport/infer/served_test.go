package infer

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
)

// scripted serves synth for the synth models, and two scripted behaviours: "fails" emits two
// tokens and fails, "blocks" emits one token and waits for its context.
type scripted struct {
	synth   *synth.Backend
	started chan struct{}
}

func (g scripted) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	switch req.Model {
	case "fails":
		for i := range 2 {
			if err := emit(inference.Token{Index: i, Text: "x", ID: i}); err != nil {
				return inference.Result{}, err
			}
		}
		return inference.Result{}, inference.Errorf(inference.CodeUnavailable, "backend crashed")
	case "blocks":
		if err := emit(inference.Token{Index: 0, Text: "x", ID: 1}); err != nil {
			return inference.Result{}, err
		}
		g.started <- struct{}{}
		<-ctx.Done()
		return inference.Result{}, ctx.Err()
	}
	return g.synth.Generate(ctx, req, emit)
}

// The hook reports each request that ran, once, with its outcome and tokens, after its
// terminal frame; and never a request refused before running.
func TestOnServedReportsEachRequestThatRan(t *testing.T) {
	be, err := synth.New(model)
	if err != nil {
		t.Fatal(err)
	}
	gen := scripted{synth: be, started: make(chan struct{}, 1)}
	var refuse atomic.Bool
	admit := func(peer.ID) error {
		if refuse.Load() {
			return inference.Errorf(inference.CodePolicyPaused, "on battery")
		}
		return nil
	}
	tasks := make(chan ServedTask, 16)
	ch, sh := newHost(t), newHost(t)
	srv := NewServer(sh, gen, WithMaxInFlight(1, 1), WithAdmission(admit),
		WithOnServed(func(st ServedTask) { tasks <- st }))
	defer srv.Close()
	connect(t, ch, sh)
	c := NewClient(ch)

	next := func(what string) ServedTask {
		t.Helper()
		select {
		case st := <-tasks:
			if st.From != ch.ID() || st.Duration <= 0 {
				t.Errorf("%s: from %s after %v, want %s and a duration", what, st.From, st.Duration, ch.ID())
			}
			return st
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no served task reported", what)
			return ServedTask{}
		}
	}
	generate := func(ctx context.Context, req *inference.Request) error {
		_, err := c.Generate(ctx, sh.ID(), req, collect(new([]inference.Token)))
		return err
	}

	// Completed: the usage of the result.
	res, err := c.Generate(context.Background(), sh.ID(), request(8), collect(new([]inference.Token)))
	if err != nil {
		t.Fatal(err)
	}
	st := next("completed")
	if st.Outcome != OutcomeCompleted || st.Model != model ||
		st.PromptTokens != res.Usage.PromptTokens || st.CompletionTokens != res.Usage.CompletionTokens || st.PromptTokens == 0 {
		t.Errorf("completed: %+v, want completed with usage %+v", st, res.Usage)
	}

	// A backend error: its code, and the tokens emitted before it.
	fails := request(8)
	fails.Model = "fails"
	if err := generate(context.Background(), fails); inference.CodeOf(err) != inference.CodeUnavailable {
		t.Fatalf("fails: %v, want unavailable", err)
	}
	if st := next("backend error"); st.Outcome != string(inference.CodeUnavailable) || st.PromptTokens != 0 || st.CompletionTokens != 2 {
		t.Errorf("backend error: %+v, want unavailable with 0 prompt and 2 completion tokens", st)
	}

	// Refused before running: invalid, paused by admission. Not reported.
	invalid := request(8)
	invalid.Messages = nil
	if err := generate(context.Background(), invalid); inference.CodeOf(err) != inference.CodeInvalidRequest {
		t.Fatalf("invalid: %v, want invalid_request", err)
	}
	refuse.Store(true)
	if err := generate(context.Background(), request(8)); inference.CodeOf(err) != inference.CodePolicyPaused {
		t.Fatalf("paused: %v, want policy_paused", err)
	}
	refuse.Store(false)

	// Overloaded while a request runs: not reported. Then the running one is cancelled by its
	// client: client_disconnected, with the one token written to it (streaming: each token
	// goes out as it is produced).
	ctx, cancel := context.WithCancel(context.Background())
	blocks := request(8)
	blocks.Model, blocks.Stream = "blocks", true
	errc := make(chan error, 1)
	go func() { errc <- generate(ctx, blocks) }()
	<-gen.started
	if err := generate(context.Background(), request(8)); inference.CodeOf(err) != inference.CodeOverloaded {
		t.Fatalf("second request: %v, want overloaded", err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: %v, want context.Canceled", err)
	}
	if st := next("client cancel"); st.Outcome != OutcomeClientDisconnected || st.Model != "blocks" || st.CompletionTokens != 1 {
		t.Errorf("client cancel: %+v, want client_disconnected with 1 completion token", st)
	}

	// Close waits for the handlers: every report has been made.
	srv.Close()
	select {
	case st := <-tasks:
		t.Errorf("an extra task was reported: %+v", st)
	default:
	}
	stats := srv.Stats()
	if stats.Served != 1 || stats.Failed != 4 || stats.Overloaded != 1 || stats.ClientDisconnected != 1 {
		t.Errorf("stats %+v, want 1 served, 4 failed (unavailable, invalid, paused, overloaded), 1 overloaded, 1 disconnected", stats)
	}
}

// A generation ended by Close is reported as shutting_down.
func TestOnServedReportsShutdown(t *testing.T) {
	tasks := make(chan ServedTask, 4)
	ch, sh, gen, srv := blockingServer(t, 1, WithOnServed(func(st ServedTask) { tasks <- st }))
	errc := make(chan error, 1)
	go func() {
		_, err := NewClient(ch).Generate(context.Background(), sh.ID(), request(8), func(inference.Token) error { return nil })
		errc <- err
	}()
	<-gen.started
	srv.Close()
	<-errc
	if len(tasks) != 1 {
		t.Fatalf("%d tasks reported by the time Close returned, want 1", len(tasks))
	}
	if st := <-tasks; st.Outcome != string(inference.CodeShuttingDown) || st.CompletionTokens != 1 {
		t.Errorf("%+v, want shutting_down with 1 completion token", st)
	}
}

// A client that asks for receipts gets the signer's receipt in the done frame, made over the
// digest of exactly the tokens it received; the served task reports the same receipt. A
// client that does not ask gets none, a failed task none, and a signer's error only drops
// the receipt.
func TestReceiptsOnRequest(t *testing.T) {
	be, err := synth.New(model)
	if err != nil {
		t.Fatal(err)
	}
	var failSign atomic.Bool
	signed := make(chan ServedTask, 4)
	sign := func(st ServedTask) (string, error) {
		if failSign.Load() {
			return "", errors.New("no key")
		}
		signed <- st
		return "receipt:" + st.Output.String(), nil
	}
	tasks := make(chan ServedTask, 8)
	ch, sh := newHost(t), newHost(t)
	srv := NewServer(sh, scripted{synth: be}, WithSigner(sign), WithOnServed(func(st ServedTask) { tasks <- st }))
	defer srv.Close()
	connect(t, ch, sh)

	var toks []inference.Token
	res, err := NewClient(ch, WithReceipts()).Generate(context.Background(), sh.ID(), request(12), collect(&toks))
	if err != nil {
		t.Fatal(err)
	}
	st := <-signed
	if want := "receipt:" + inference.DigestOf(toks).String(); res.Receipt != want {
		t.Fatalf("receipt %q, want %q", res.Receipt, want)
	}
	if st.From != ch.ID() || st.Model != model || st.Outcome != OutcomeCompleted || st.End.IsZero() ||
		st.CompletionTokens != res.Usage.CompletionTokens || st.PromptTokens != res.Usage.PromptTokens {
		t.Fatalf("signer got %+v for %+v", st, res)
	}
	if served := <-tasks; served.Receipt != res.Receipt || served.End != st.End || served.Duration != st.Duration {
		t.Fatalf("served task %+v, signed %+v", served, st)
	}

	// Not asked for: none, and the signer is not called.
	if res, err := NewClient(ch).Generate(context.Background(), sh.ID(), request(4), collect(new([]inference.Token))); err != nil || res.Receipt != "" {
		t.Fatalf("without asking: %+v, %v", res, err)
	}
	// A failed task: none.
	req := request(4)
	req.Model = "fails"
	if _, err := NewClient(ch, WithReceipts()).Generate(context.Background(), sh.ID(), req, collect(new([]inference.Token))); inference.CodeOf(err) != inference.CodeUnavailable {
		t.Fatalf("failing model: %v", err)
	}
	// A signer that fails: the result still arrives, without a receipt.
	failSign.Store(true)
	if res, err := NewClient(ch, WithReceipts()).Generate(context.Background(), sh.ID(), request(4), collect(new([]inference.Token))); err != nil || res.Receipt != "" {
		t.Fatalf("failing signer: %+v, %v", res, err)
	}
	if len(signed) != 0 {
		t.Fatalf("signer called %d more times", len(signed))
	}
}
