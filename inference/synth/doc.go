// Package synth is the built-in synthetic backend: a real decoder-only transformer, computed
// in pure Go float32, whose weights come from a pseudo-random generator keyed by the model
// name. It needs no download, so a node can serve inference out of the box.
//
// Its text is meaningless. The weights are random numbers, not trained on anything, and the
// vocabulary is an enumeration of made-up syllables: output looks like pseudo-words
// ("thoung bre kai,st") and says nothing. What is real is everything the mesh needs to be
// exercised honestly: the cost (every token runs every layer), the cold start (weights are
// materialized on load), the streaming, the context window, and determinism.
//
// # Model
//
// Token embedding plus a learned positional embedding, then per layer
// RMSNorm → multi-head causal self-attention with a KV cache → residual → RMSNorm →
// MLP (up, SiLU, down) → residual; a final RMSNorm and a separate (untied) output
// projection. No biases. Prompts are processed 16 tokens per pass (each weight row read once
// for all of them); then one token per pass. Large matrix products are split by rows over
// GOMAXPROCS goroutines.
//
// Weights: each tensor is drawn from its own PCG generator (math/rand/v2) seeded with FNV-64a
// of "<model>/<tensor>", through a cheap near-normal transform (the sum of four 16-bit
// uniforms), scaled so activations stay of order 1 (the table is on weights.tensors). Norm
// gains are 1.
//
// # Presets
//
//	name          d_model  layers  heads  ffn   vocab  context  parameters
//	synth-tiny         64       2      4   256    512      512     196,928
//	synth-small       256       4      8  1024   2048     4096   5,245,184
//	synth-base        512       8      8  2048   4096     4096  31,465,984
//	synth-large       768      16     12  3072   4096     1024 120,349,440
//
// Memory is 4 bytes per parameter (synth-base: 126 MB; synth-large: 481 MB) once loaded,
// plus per request a KV cache of 2·layers·d_model·4 bytes per position of prompt and budget
// (synth-base: 32 KiB per position, 128 MiB at a full context; synth-large: 96 KiB and 96
// MiB). synth-small's and synth-base's windows are 4,096 tokens, so that a generation can be
// moved at a long context (issue 17's M1 and M2); the window only sizes the position table,
// and the first 1,024 positions have the values they had when it was 1,024. synth-large is the model a node's memory budget is not meant to hold whole: it runs
// sharded (see Shards), at 8 to 9 tokens/s on a busy 2-core machine, split or not.
//
// # Shards
//
// A model too big for one node runs as a pipeline of stages, each holding a contiguous
// range of layers, and a head holding the rest (the contract is in the parent package:
// StageBackend, StageSession, Layers). Backend is an inference.StageBackend.
//
// A stage (OpenStage) holds layers [lo, hi) and nothing else. A tensor's values are a
// function of its name alone, so loading a range materializes those layers' tensors and
// no others (not the other layers, not the embeddings), and they are the same numbers as in
// the whole model. Each distinct range is loaded once and kept until the stage budget needs
// its room (Stage memory, below; a range is taken from the whole model instead when that is
// loaded). Ranges lists the ranges loading and loaded, and WithOnRangeChange reports each
// change of that list as it happens, unloads included (a node announces it: state loading,
// then warm, then gone).
// A session is one generation's KV cache for those layers, allocated at open for
// maxPositions positions; Forward runs n positions through the layers in passes of 16, as
// Generate runs a prompt, appends them to the cache, and fails with context_overflow past
// maxPositions.
//
// The head (GenerateWith) holds the token and position embeddings, the final norm and the
// output projection: Generate's contract, with every layer computed by a Layers function.
// It embeds the whole prompt and calls the layers once with it (n = prompt length: one
// round trip per stage), takes the logits of the last position and samples; then for each
// token but the last it embeds that token at its position and calls the layers with n = 1.
// Each position is computed by the same operations however positions are split into calls
// and passes (TestFeedSplitInvariant), so one call for the prompt gives the same bits as
// 16 positions at a time. Generate is GenerateWith whose layers are a session of all the
// layers run here: one generation loop, and a sharded generation emits exactly what
// Generate emits (TestShardedIdentical), which keeps TestGolden's protocol for shards.
//
// What a stage of k layers needs is k·LayerBytes of weights, and per session k/Layers of
// KVBytesPerToken per position plus 16 positions of scratch, 16·(4·d_model+ffn)·4 bytes.
// The head needs HeadBytes, and per request the prompt's hidden states once (prompt
// length·d_model·4 bytes) and the logits.
//
//	model        one layer  head     whole    KV per position, all layers
//	synth-small    3.1 MB    8.4 MB   21.0 MB   8 KiB
//	synth-base    12.6 MB   25.2 MB  125.9 MB  32 KiB
//	synth-large   28.3 MB   28.3 MB  481.4 MB  96 KiB
//
// synth-large in two stages of 8 layers takes 226.5 MB and 48 KiB per position on each
// stage, and 28.3 MB on the head. Measured by TestStageMemory, opening a session of
// synth-base's layers [2, 6) for 16 positions grows the heap by 50.87 MB for 50.35 MB of
// weights: the rest is the session's KV cache (256 KiB) and scratch (256 KiB).
//
// # Stage memory
//
// A node gives pipeline stages a memory budget (WithStageBudget, SetStageBudget; the node's
// --memory-budget). What counts against it: every range loaded or loading, at its weights'
// bytes (layers × LayerBytes, counted once however many sessions use it), and every open
// session's KV cache, KVBytesPerToken × layers ÷ Layers × maxPositions: the figures
// placement plans with (mesh/route's StageBytes), so a plan that fits a node's announced
// budget is one the node admits. Not counted: whole models and heads, which a node's own
// requests and the whole-model tasks it serves load (routing sends a model whole only to a
// node whose budget holds it, and they are never unloaded); a range served from the loaded
// whole model (its session's cache is counted); a session's scratch, 16 positions of
// activations (0.13 MB for synth-small, 0.39 MB for synth-large), and bookkeeping, which the
// 10 % margin of S4 covers.
//
// A range is pinned while a session of it is open or an open is loading it. An open that
// would pass the budget first unloads ranges no session pins, the least recently used
// first (opened or closed longest ago), as few as make room; when even all of those would
// not make room it is refused with overloaded, naming the MB it needs and the MB the pinned
// ranges and caches leave free, and nothing is unloaded. A lowered budget unloads at once
// what is unpinned and over it; what is pinned is unloaded as its sessions close, until
// what is held fits. An unloaded range leaves Ranges (and the node's announced stages);
// opening it again loads it again. TestStageBudget checks the rule; TestStageBudgetHeap
// checks, on the heap, that what is held stays within the budget and 10 % as sessions of
// different ranges come and go.
//
// A pipeline in one process costs what Generate costs: BenchmarkShardedDecode measured
// synth-large's time per token over 2 stages at 1.04 times Generate's, and
// BenchmarkShardedPrefill synth-base's 512-token prefill over 3 stages at 1.05 times.
// Between nodes, each call adds a round trip and n·d_model·4 bytes each way.
//
// # Tokenizer
//
// Byte-level with syllables: token 0 ends the text, tokens 1-4 mark the chat roles
// (system, developer, user, assistant), tokens 5-260 are the 256 byte values, and the rest
// of the vocabulary is pseudo-syllables such as "ka" or " bre", built by a fixed
// enumeration. Encoding takes the longest matching syllable at each position, else the
// byte, so it is total and lossless. The chat template is, for each message, its role
// marker then its content, and finally the assistant marker. The model never samples a role
// marker nor a byte outside printable ASCII and newline, so output is printable.
//
// # Decoding
//
// Temperature 0 is greedy (argmax, lowest id on ties); seed and top_p are then ignored.
// Otherwise logits are divided by the temperature, softmax, restricted to the top_p nucleus
// (most probable first, ties by lower id), and sampled with one uniform draw per token from
// a PCG seeded by the request's seed (0 when absent). Generation ends at the end-of-text
// token (finish "stop"), when a stop string appears (finish "stop"), or at max_tokens or
// the end of the context window (finish "length"). A prompt that leaves no room for one
// token in the context window is a context_overflow error.
//
// Stop strings follow OpenAI: the output ends just before the first occurrence of any stop
// string in the generated text (the prompt is not searched); the stop string itself is not
// returned. Tokens that might begin a stop string are held back until the following tokens
// decide, so nothing emitted is ever taken back; the token in which the stop string begins
// is emitted cut to the text before it, if any text remains.
//
// # Determinism
//
// The output (token ids, texts, finish reason, usage) is a function of (model, messages,
// seed, temperature, top_p, max_tokens, stop) alone: identical in one process or another,
// on any GOMAXPROCS, and by construction on any architecture. No result depends on map
// iteration or goroutine order; products are rounded explicitly so the compiler cannot fuse
// them into FMAs, and exp is our own rather than math.Exp, whose results vary by CPU.
// Because one uniform draw is taken per token, a completion with a smaller max_tokens is a
// prefix of one with a larger budget. The mesh relies on this to verify a result by
// recomputing it and to resume a cut stream on another node. TestGolden pins the token ids
// and TestGoldenLogits the exact logit bits (checked equal on amd64, GOAMD64=v3 and arm64);
// changing either is a protocol change between versions.
//
// # Imports
//
// Standard library and the parent package inference only (a leaf, like its parent).
package synth
