package mux

import (
	"testing"

	muxtest "github.com/libp2p/go-libp2p/p2p/muxer/testsuite"
	"go.uber.org/goleak"
)

// The conformance suite's GoServe never closes its listener (upstream's leak, not ours).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/libp2p/go-libp2p/p2p/muxer/testsuite.GoServe.func1"))
}

// TestConformance runs go-libp2p's multiplexer test suite, the one yamux passes: stress
// (up to 1,000 streams, 10 MB), open stress (50,000 streams), reset, write after close,
// streams left open.
func TestConformance(t *testing.T) {
	muxtest.SubtestAll(t, &Transport{})
}
