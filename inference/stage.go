package inference

import "context"

// Sharded inference: a model too big for one node runs as a pipeline of stages, each
// holding a contiguous range of the model's layers. The node that took the request (the
// head) turns the prompt into hidden states, sends them through the stages in order, and
// samples each next token from what comes back; the stages compute only their layers.
//
// This file is the contract between the pieces: a backend that can hold a layer range
// (StageBackend), the shape of a model as routing and placement need it (ModelShape), and
// the head's side of a generation (Head, given the pipeline as Layers). The wire protocol that carries hidden states
// between nodes is transport/stage; the placement plan is mesh/route.

// ModelShape is what placing a model needs to know of it. Sizes are in bytes as loaded.
type ModelShape struct {
	// Layers is the number of transformer layers (blocks), numbered 0..Layers-1.
	Layers int `json:"layers"`
	// Width is the hidden state's size per position (d_model): a stage's input and output
	// for n positions are n × Width float32 values.
	Width int `json:"width"`
	// Params is the parameter count of the whole model.
	Params int64 `json:"params"`
	// WeightBytes is the memory of the whole model's weights once loaded.
	WeightBytes int64 `json:"weight_bytes"`
	// LayerBytes is the memory of one layer's weights (every layer is the same size).
	LayerBytes int64 `json:"layer_bytes"`
	// HeadBytes is the memory the head needs: embeddings, final norm, output projection.
	HeadBytes int64 `json:"head_bytes"`
	// KVBytesPerToken is the KV cache of one position across all layers; a stage holding k
	// of Layers layers needs k/Layers of it.
	KVBytesPerToken int64 `json:"kv_bytes_per_token"`
	// Context is the context window in positions.
	Context int `json:"context"`
}

// StageBackend runs layer ranges of the models it knows, for pipeline stages.
type StageBackend interface {
	// Shape returns model's shape, or a model_not_found *Error.
	Shape(model string) (ModelShape, error)
	// OpenStage reserves a session of model's layers [lo, hi) (0 <= lo < hi <= Layers) for
	// up to maxPositions positions, loading those layers (and only those) if they are not
	// yet. It fails with an *Error: model_not_found, invalid_request for a bad range, or
	// overloaded when it cannot hold the session.
	OpenStage(ctx context.Context, model string, lo, hi, maxPositions int) (StageSession, error)
}

// StageSession is one generation's part on one stage: its layers' KV cache.
type StageSession interface {
	// Forward runs n positions of hidden states through the session's layers, appending
	// them to its KV cache after the positions already run, and returns the n output
	// hidden states. hidden and the result are n × Width float32, row-major. Past
	// maxPositions it fails with context_overflow.
	Forward(ctx context.Context, hidden []float32, n int) ([]float32, error)
	// Close frees the session's KV cache. It is idempotent.
	Close() error
}

// StageMover is a StageSession whose KV cache can move to another session of the same
// layers: a stage that leaves with notice hands its part of a running generation to a
// replacement without a replay (transport/stage: the head fetches the leaving stage's rows
// and loads them into the replacement's sessions). The rows are KVRows over the session's
// layers only: for each of its layers [lo, hi) in order, keys then values (CheckLayers
// with hi − lo layers).
type StageMover interface {
	StageSession
	// Positions is the length of the session's KV cache: the positions run or loaded.
	Positions() int
	// Rows returns positions [from, from+n) of the cache, its values appended to dst[:0]
	// (reused when it has room). It fails with invalid_request outside [0, Positions())
	// or when the session is closed.
	Rows(dst []float32, from, n int) (KVRows, error)
	// Load appends rows to the cache: they must start at Positions(), hold exactly the
	// session's layers (CheckLayers) and fit its maxPositions; otherwise invalid_request,
	// and nothing changes. Forward then goes on after them.
	Load(r KVRows) error
}

// Layers is the function a Head calls to run every layer on n positions of hidden states,
// in order, through whatever stages hold them; it returns the last layer's output.
type Layers func(ctx context.Context, hidden []float32, n int) ([]float32, error)

// Head runs a generation whose layers are computed elsewhere: tokenization, embeddings,
// the final norm and output projection, sampling and stop strings, with Generate's
// contract (Request.Replay included), every layer computed by calling layers.
type Head interface {
	GenerateWith(ctx context.Context, req *Request, layers Layers, emit func(Token) error) (Result, error)
}
