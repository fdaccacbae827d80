package node

import (
	"crypto/rand"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/meshinfer/meshinfer/mesh/receipts"
)

// Every receipt queued from many goroutines is in the log once the queue stops, with
// sequence numbers in order and no gap; a receipt queued after the stop is dropped without a
// panic.
func TestReceiptQueueWritesEveryReceipt(t *testing.T) {
	dir := t.TempDir()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	l, err := receipts.Open(dir, key)
	if err != nil {
		t.Fatal(err)
	}
	q := newReceiptQueue(l)
	const adders, each = 8, 300 // 2,400 receipts: more than the queue holds at once
	var wg sync.WaitGroup
	for a := range adders {
		wg.Go(func() {
			for i := range each {
				q.add(receipts.Receipt{Requester: fmt.Sprintf("peer-%d", a), Model: "synth-tiny",
					TokensIn: i, Outcome: receipts.Completed})
			}
		})
	}
	wg.Wait()
	if err := q.stop(); err != nil {
		t.Fatal(err)
	}
	q.add(receipts.Receipt{Requester: "late", Model: "synth-tiny", Outcome: receipts.Completed})
	q.stop() // idempotent
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var seq uint64
	if err := receipts.Read(filepath.Join(dir, receipts.File), func(r receipts.Receipt, err error) bool {
		if err != nil || r.Seq != seq+1 || r.Requester == "late" {
			t.Fatalf("receipt after seq %d: %+v, %v", seq, r, err)
		}
		seq = r.Seq
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if seq != adders*each {
		t.Fatalf("%d receipts in the log, want %d", seq, adders*each)
	}
}
