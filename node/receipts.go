package node

import (
	"sync"
	"time"

	"github.com/meshinfer/meshinfer/mesh/receipts"
)

// receiptQueue appends served tasks' receipts to the receipts log on a goroutine of its own,
// in the order the tasks ended, in batches (receiptBatchDelay). The peer inference server reports a task after its terminal
// frame, on the goroutine that then reads the next request of a reused stream: an fsync per
// receipt there (a few hundred µs) held up every next request on the stream. A receipt was
// never part of the requester's answer, so nothing the requester sees waits for it now.
//
// The queue holds up to receiptBacklog receipts; past that, add blocks, so that a disk too
// slow for the tasks served slows serving instead of growing memory. stop drains the queue
// and waits for the writer; the node stops it after the inference server (no more tasks)
// and before the log closes.
type receiptQueue struct {
	log *receipts.Log
	in  chan receipts.Receipt
	wg  sync.WaitGroup

	mu      sync.Mutex
	stopped bool           // stop has begun: add drops (and logs) what comes after
	adding  sync.WaitGroup // adds between their check of stopped and their send
}

// receiptBacklog bounds the receipts waiting for the disk (each under 1 KiB in memory).
const receiptBacklog = 1024

// Receipts are written in batches: those that arrive within receiptBatchDelay (1 s) of the
// first, at most receiptBatchMax (256), go to the log with one sync. Signing, encoding and
// syncing after each task slowed the requests in flight on a 2-core machine: B1-ttft's
// routed first token came 100-250 µs later with a write per task or per 100 ms window, and
// no later than a bare host's with a 1 s window. A crash loses at most the receipts of the
// last second; none was part of a requester's answer, and a requester that asked for a
// receipt (a coordinator) holds its own signed copy.
const (
	receiptBatchDelay = time.Second
	receiptBatchMax   = 256
)

func newReceiptQueue(l *receipts.Log) *receiptQueue {
	q := &receiptQueue{log: l, in: make(chan receipts.Receipt, receiptBacklog)}
	q.wg.Go(func() { // ends when stop closes in, after the last receipt
		var batch []receipts.Receipt
		window := time.NewTimer(receiptBatchDelay)
		window.Stop()
		for r := range q.in {
			// Collect what comes within the window after the first receipt, then write it
			// all with one sync.
			batch = append(batch[:0], r)
			window.Reset(receiptBatchDelay)
		collect:
			for len(batch) < receiptBatchMax {
				select {
				case r, ok := <-q.in:
					if !ok {
						break collect // stopping: write what there is now
					}
					batch = append(batch, r)
				case <-window.C:
					break collect
				}
			}
			window.Stop()
			if err := q.log.AppendAll(batch); err != nil {
				log.Errorw("receipts not recorded", "count", len(batch), "err", err)
			}
		}
	})
	return q
}

// add queues r for the log. After stop (which the node calls once every task has ended,
// so only a bug gets here) r is logged as lost instead.
func (q *receiptQueue) add(r receipts.Receipt) {
	q.mu.Lock()
	if q.stopped {
		q.mu.Unlock()
		log.Errorw("receipt not recorded: the receipts log is closing", "peer", r.Requester, "model", r.Model)
		return
	}
	q.adding.Add(1)
	q.mu.Unlock()
	defer q.adding.Done()
	q.in <- r
}

// stop writes the receipts still queued and waits for the writer. It is idempotent.
func (q *receiptQueue) stop() error {
	q.mu.Lock()
	was := q.stopped
	q.stopped = true
	q.mu.Unlock()
	if !was {
		q.adding.Wait() // no send can follow the close
		close(q.in)
	}
	q.wg.Wait()
	return nil
}
