package node

import (
	"crypto/rand"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/meshinfer/meshinfer/mesh/receipts"
)

// Every receipt queued from many goroutines is in the log once the queue stops, with
// sequence numbers in order and no gap; a receipt queued after the stop is dropped without a
// panic.
func TestReceiptQueueWritesEveryReceipt(t *testing.T) {
	dir, l := openReceipts(t)
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

// A lone receipt reaches the log once its batch window has passed, without waiting for more;
// receipts that arrive within the window go with it (virtual time: testing/synctest).
func TestReceiptQueueWritesWithinItsWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir, l := openReceipts(t)
		defer l.Close()
		q := newReceiptQueue(l)
		defer q.stop()
		count := func() int {
			n := 0
			receipts.Read(filepath.Join(dir, receipts.File), func(receipts.Receipt, error) bool { n++; return true })
			return n
		}
		add := func(who string) {
			q.add(receipts.Receipt{Requester: who, Model: "synth-tiny", Outcome: receipts.Completed})
		}
		add("first")
		time.Sleep(receiptBatchDelay / 2)
		add("second") // within the first one's window
		synctest.Wait()
		if n := count(); n != 0 {
			t.Fatalf("%d receipts written before the window closed", n)
		}
		time.Sleep(receiptBatchDelay / 2)
		synctest.Wait()
		if n := count(); n != 2 {
			t.Fatalf("%d receipts written once the window closed, want both", n)
		}
	})
}

// openReceipts opens a receipts log in a new directory under a new key.
func openReceipts(t *testing.T) (dir string, l *receipts.Log) {
	t.Helper()
	dir = t.TempDir()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if l, err = receipts.Open(dir, key); err != nil {
		t.Fatal(err)
	}
	return dir, l
}
