package synth

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

// Backend serves a fixed set of synthetic models. It is safe for concurrent use. It starts
// no goroutines of its own (matrix products may use short-lived helpers that end before
// they return), so it has no Close; dropping it frees the weights.
type Backend struct {
	names  []string          // served models, in New's order
	models map[string]*model // read-only after New
	// loadDelay is added to every load (WithLoadDelay).
	loadDelay time.Duration
}

// Option configures a Backend.
type Option func(*Backend)

// WithLoadDelay adds d to every model load, standing for reading weights from disk: the
// presets materialize in milliseconds, a real model takes seconds, and a testnet that shows
// cold starts (speculative dispatch racing a cold model) needs them as long as real ones.
// The wait ends early, with the model still cold, when the load's context ends.
func WithLoadDelay(d time.Duration) Option { return func(b *Backend) { b.loadDelay = d } }

var _ inference.Backend = (*Backend)(nil)

// model is one served preset and its load state.
type model struct {
	preset Preset
	tok    *tokenizer

	// loads counts materializations started, for tests of load-once.
	loads atomic.Int64
	// delay is the backend's load delay (WithLoadDelay).
	delay time.Duration

	mu sync.Mutex
	// w is non-nil once the weights are loaded; they never change after that.
	w *weights
	// loading is non-nil while a load runs; it is closed when that load ends, either way.
	loading chan struct{}
}

// New returns a backend serving the named presets, cold: no weights are materialized until
// the first request for a model or a call to Load. Unknown or repeated names are an error.
func New(models ...string) (*Backend, error) { return NewWith(models, nil) }

// NewWith is New with options.
func NewWith(models []string, opts []Option) (*Backend, error) {
	if len(models) == 0 {
		return nil, fmt.Errorf("synth: no models given (known: %s)", presetNames())
	}
	b := &Backend{models: make(map[string]*model, len(models))}
	for _, name := range models {
		p, ok := LookupPreset(name)
		if !ok {
			return nil, fmt.Errorf("synth: unknown model %q (known: %s)", name, presetNames())
		}
		if _, dup := b.models[name]; dup {
			return nil, fmt.Errorf("synth: model %q given twice", name)
		}
		b.names = append(b.names, name)
		b.models[name] = &model{preset: p, tok: newTokenizer(p.Vocab)}
	}
	for _, o := range opts {
		o(b)
	}
	for _, m := range b.models {
		m.delay = b.loadDelay
	}
	return b, nil
}

// Models lists the served models in New's order; Warm is true once a model's weights are
// materialized. It never fails.
func (b *Backend) Models(ctx context.Context) ([]inference.ModelInfo, error) {
	infos := make([]inference.ModelInfo, 0, len(b.names))
	for _, name := range b.names {
		m := b.models[name]
		m.mu.Lock()
		warm := m.w != nil
		m.mu.Unlock()
		infos = append(infos, inference.ModelInfo{Name: name, Warm: warm, Deterministic: true})
	}
	return infos, nil
}

// Load materializes the weights of model now, so that its first request pays no cold start.
// It returns at once if they are already loaded and waits if another call is loading them.
// If ctx ends first it returns ctx's error and the model stays cold (a later call retries).
func (b *Backend) Load(ctx context.Context, model string) error {
	m, err := b.lookup(model)
	if err != nil {
		return err
	}
	_, err = m.load(ctx)
	return err
}

func (b *Backend) lookup(name string) (*model, error) {
	m, ok := b.models[name]
	if !ok {
		return nil, inference.Errorf(inference.CodeModelNotFound,
			"model %q is not served here (serving %s)", name, strings.Join(b.names, ", "))
	}
	return m, nil
}

// load returns the weights, materializing them on first use. Concurrent callers share one
// materialization; a caller whose ctx ends stops waiting, and if it was the one loading, the
// load is abandoned and the next caller starts over.
func (m *model) load(ctx context.Context) (*weights, error) {
	for {
		m.mu.Lock()
		if w := m.w; w != nil {
			m.mu.Unlock()
			return w, nil
		}
		if wait := m.loading; wait != nil {
			m.mu.Unlock()
			select {
			case <-wait:
				continue // loaded, or the loader gave up: look again
			case <-ctx.Done():
				return nil, fmt.Errorf("synth: waiting for %s to load: %w", m.preset.Name, ctx.Err())
			}
		}
		if err := ctx.Err(); err != nil {
			m.mu.Unlock()
			return nil, fmt.Errorf("synth: loading %s: %w", m.preset.Name, err)
		}
		done := make(chan struct{})
		m.loading = done
		m.mu.Unlock()

		m.loads.Add(1)
		w, err := materialize(ctx, m.preset)
		if err == nil && m.delay > 0 {
			t := time.NewTimer(m.delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				w, err = nil, ctx.Err()
			}
			t.Stop()
		}

		m.mu.Lock()
		m.w = w // nil on error: the model stays cold
		m.loading = nil
		m.mu.Unlock()
		close(done)
		if err != nil {
			return nil, fmt.Errorf("synth: loading %s: %w", m.preset.Name, err)
		}
		return w, nil
	}
}

// Generate runs one completion; see inference.Backend for the contract. In order it checks
// the model (model_not_found), the request (invalid_request, by Request.Validate without
// size limits: those are the API's), the prompt's length (context_overflow when the chat
// template leaves no room for one token), then loads the model if cold, processes the prompt
// and samples until the end-of-text token or a stop string (FinishStop), or until max_tokens
// or the context window is reached (FinishLength).
func (b *Backend) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	m, err := b.lookup(req.Model)
	if err != nil {
		return inference.Result{}, err
	}
	if err := req.Validate(inference.NoSizeLimits()); err != nil {
		return inference.Result{}, err
	}
	p := m.preset
	prompt := m.tok.encodeChat(req.Messages, p.Context)
	if len(prompt) >= p.Context {
		return inference.Result{}, inference.Errorf(inference.CodeContextOverflow,
			"prompt needs at least %d tokens, %s has a context window of %d", len(prompt), p.Name, p.Context)
	}
	if err := ctx.Err(); err != nil {
		return inference.Result{}, fmt.Errorf("synth: %w", err)
	}
	w, err := m.load(ctx)
	if err != nil {
		return inference.Result{}, err
	}

	// The budget is max_tokens, cut to what the context window leaves. The cache needs no
	// slot for the last sampled token: it is never fed back.
	budget := min(req.EffectiveMaxTokens(), p.Context-len(prompt))
	st := newState(w, len(prompt)+budget-1)
	logits, err := st.feed(ctx, prompt)
	if err != nil {
		return inference.Result{}, fmt.Errorf("synth: prompt: %w", err)
	}
	smp := newSampler(req.EffectiveTemperature(), req.EffectiveTopP(), req.EffectiveSeed(), m.tok.sampleable)
	stop := newStopper(req.Stop)
	usage := inference.Usage{PromptTokens: len(prompt)}
	result := func(fr inference.FinishReason) inference.Result {
		usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
		return inference.Result{FinishReason: fr, Usage: usage}
	}
	for {
		id := smp.pick(logits)
		if id == idEOT {
			if err := emitAll(emit, stop.flush()); err != nil {
				return inference.Result{}, err
			}
			return result(inference.FinishStop), nil
		}
		usage.CompletionTokens++
		ready, stopped := stop.push(id, m.tok.pieces[id])
		if err := emitAll(emit, ready); err != nil {
			return inference.Result{}, err
		}
		if stopped {
			return result(inference.FinishStop), nil
		}
		if usage.CompletionTokens == budget {
			if err := emitAll(emit, stop.flush()); err != nil {
				return inference.Result{}, err
			}
			return result(inference.FinishLength), nil
		}
		if logits, err = st.feed(ctx, []int{id}); err != nil {
			return inference.Result{}, fmt.Errorf("synth: generation: %w", err)
		}
	}
}

func emitAll(emit func(inference.Token) error, toks []inference.Token) error {
	for _, t := range toks {
		if err := emit(t); err != nil {
			return err
		}
	}
	return nil
}
