package infer

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// Every request frame the server reads, on a new stream or a reused one, is metered alone
// and reported with its sender: a long prompt's frame is one transfer of its bytes, a
// sample's size; a short one's is its few bytes.
func TestRequestFramesAreMetered(t *testing.T) {
	var (
		mu   sync.Mutex
		from []peer.ID
		got  []bandwidth.Transfer
	)
	p := newPair(t, []ServerOption{WithServerTransfers(func(f peer.ID, tr bandwidth.Transfer) {
		mu.Lock()
		defer mu.Unlock()
		from, got = append(from, f), append(got, tr)
	})})
	long := request(4)
	long.Messages[0].Content = strings.Repeat("a long prompt ", 6000) // 84 KB
	var want []int64
	for _, req := range []*inference.Request{long, request(4), long} {
		body, err := EncodeRequest(req, false)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, int64(len(frame.Append(nil, body))))
		// The long prompt overflows the model's context: the frame was read all the same.
		p.client.Generate(context.Background(), p.sh.ID(), req, func(inference.Token) error { return nil })
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(want) {
		t.Fatalf("%d transfers reported, want %d", len(got), len(want))
	}
	client := p.client.h.ID()
	for i, tr := range got {
		if from[i] != client || tr.Dir != bandwidth.Down || tr.Bytes != want[i] {
			t.Fatalf("request %d: %+v from %s, want %d bytes from %s", i, tr, from[i], want[i], client)
		}
	}
	if want[0] < bandwidth.MinBytes || want[1] >= bandwidth.MinBytes {
		t.Fatalf("request frames of %v bytes: the test wants a long one and a short one", want)
	}
}
