# meshinfer: the commands a developer and CI use. See README.md.
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# CI runs on 2 cores; -race and a timeout that fails loudly instead of hanging CI.
TESTFLAGS ?= -race -count=1 -timeout 14m

.PHONY: build run test bench fuzz soak reliability lint clean

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/meshinfer ./cmd/meshinfer

# A 5-node testnet on loopback with the built-in model: a table of nodes, a few requests,
# synth-large served by a pipeline of layer ranges (no node's budget holds it), then live status.
run: build
	./bin/meshinfer testnet --nodes 5 --scenario shard

test:
	$(GO) vet ./...
	$(GO) test $(TESTFLAGS) ./...
	# 3,000 verified tasks by honest peers, without -race (which makes the model 20x slower).
	$(GO) test -count=1 -run '^TestHonestPeersPassThousandsOfVerifications$$' ./node/dispatch/

# Ratio benchmarks (docs/benchmarks.md); each reports its reference measured in the same run.
bench:
	$(GO) test -run='^$$' -bench=. -benchtime=1x ./testnet/
	$(GO) test -run='^$$' -bench=. ./mesh/... ./reputation/
	$(GO) test -run='^$$' -bench=Coordinator -benchtime=300x ./transport/gateway/client/
	$(GO) test -run='^$$' -bench=. -benchtime=300x ./transport/webrtc/
	$(GO) test -run='^$$' -bench=Slowloris ./transport/
	$(GO) test -run='^$$' -bench='S1|S2' ./transport/stage/
	$(GO) test -run='^$$' -bench=Sharded ./inference/synth/
	$(GO) test -run='^$$' -bench=M3 -benchtime=5x ./transport/bwprobe/

# Each fuzz target for 60 s (T3 in docs/reliability.md: not part of CI; seeds run in `make test`).
FUZZTIME ?= 60s
FUZZ_TARGETS := \
	./mesh/caps/:FuzzDecode ./mesh/caps/:FuzzVerifySignature ./reputation/:FuzzStoreOps \
	./mesh/probe/:FuzzParseMeminfo ./mesh/probe/:FuzzParseNVIDIASMI ./mesh/probe/:FuzzParseCPUInfo \
	./mesh/receipts/:FuzzParse ./mesh/receipts/:FuzzParseTask ./mesh/receipts/:FuzzTaskEnvelope \
	./mesh/receipts/:FuzzParseStage \
	./mesh/participation/:FuzzDecodeOverrides ./mesh/participation/:FuzzDecodeConsent \
	./mesh/participation/:FuzzPolicyHysteresis ./mesh/route/:FuzzRouterSelect \
	./node/dispatch/:FuzzVerifierQuorum \
	./inference/:FuzzRequestJSON ./inference/:FuzzDigest ./inference/:FuzzParseDigest \
	./inference/upstream/:FuzzSSE ./internal/frame/:FuzzReader ./node/console/:FuzzStatusQuery \
	./transport/infer/:FuzzRequestFrame ./transport/infer/:FuzzResponseFrame \
	./transport/infer/:FuzzServeStream ./transport/infer/:FuzzAnswerStream \
	./transport/infer/:FuzzKVFrame ./transport/infer/:FuzzGoFrame ./transport/infer/:FuzzMovedReadyFrame \
	./internal/jsonlog/:FuzzScan ./internal/sse/:FuzzReaderSplit \
	./transport/openai/:FuzzChatCompletionBody ./transport/webrtc/:FuzzDecodeSignal \
	./transport/webrtc/:FuzzSanitizeSDP ./transport/webrtc/:FuzzSignalReader ./transport/stage/:FuzzStageFrame \
	./transport/gateway/:FuzzDecodeKeys ./transport/gateway/:FuzzParseEvent \
	./transport/gateway/:FuzzKeyFromHeader ./transport/gateway/:FuzzDecodeClientMessage \
	./transport/gateway/:FuzzEventWriter ./transport/gateway/:FuzzWSFrames \
	./transport/bwprobe/:FuzzProbeFrame
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$name in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) $$pkg || exit 1; \
	done

# Long-running tests (T3 in docs/reliability.md), behind a build tag so CI never runs them.
soak:
	$(GO) test -race -count=1 -tags soak -timeout 30m -run Soak ./...

# Every case of the reliability catalogue this machine can run, one table (docs/reliability.md,
# "make reliability"), each fuzz target fuzzed 60 s after its seeds. RELFLAGS: e.g.
# -o table.md, -case '^F1$$', -fuzztime 60s.
RELFLAGS ?= -fuzztime 60s
reliability:
	$(GO) run ./testnet/reliability $(RELFLAGS)

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1)
	$(GO) vet ./...

clean:
	rm -rf bin
