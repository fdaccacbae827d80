package dispatch

import (
	"context"
	"errors"
	"sync"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/route"
)

var errSpeculationLost = errors.New("speculative cloud stream lost the race to the local model")

// speculate races the local model's load against a cloud stream (see the package
// documentation). done is false when nothing reached the client and no side completed, so
// the caller goes on with the remaining targets; err is then the last failure, and
// cloudLeft says the cloud did not fail (local won the race, then failed) and may still be
// tried.
func (r *run) speculate(ctx context.Context, ld Loader, local, cloud route.Target) (res inference.Result, err error, done, cloudLeft bool) {
	d := r.d
	d.stats.specStarted.Add(1)

	// The load runs under the executor's context: when the cloud wins, it goes on warming
	// the model for the next request, owned by the executor (Close waits for it).
	ready := make(chan error, 1)
	started := d.background(func() {
		start := d.now()
		err := ld.Load(d.bg, r.req.Model)
		if err == nil {
			d.noteColdStart(r.req.Model, d.now().Sub(start))
		}
		ready <- err
	})
	if !started { // Close has begun: start nothing it would not wait for
		return inference.Result{}, inference.Errorf(inference.CodeShuttingDown, "node is shutting down"), true, false
	}

	// The cloud stream runs on its own goroutine, which speculate waits for (cloudDone) on
	// every path. It may emit to the client only once it has claimed the race with its first
	// token; once local has claimed it, the cloud's next emit stops it.
	const (
		undecided = iota
		localWon
		cloudWon
	)
	var (
		claimMu sync.Mutex
		winner  = undecided
	)
	claim := func(w int) int {
		claimMu.Lock()
		defer claimMu.Unlock()
		if winner == undecided {
			winner = w
		}
		return winner
	}
	cctx, cancelCloud := context.WithCancel(ctx)
	defer cancelCloud()
	type outcome struct {
		res  inference.Result
		err  error
		last bool
	}
	cloudDone := make(chan outcome, 1)
	r.attempts++ // the cloud attempt
	r.last = cloud
	at := r.at(cloud)
	go func() {
		m := d.measure(&r.req)
		var emitErr error
		res, err := d.cfg.Cloud.Generate(cctx, &r.req, func(tok inference.Token) error {
			if claim(cloudWon) != cloudWon {
				return errSpeculationLost
			}
			m.token()
			if emitErr = r.emit(at, tok); emitErr != nil {
				return emitErr
			}
			r.sent = append(r.sent, tok)
			return nil
		})
		if !errors.Is(err, errSpeculationLost) {
			m.served = res.Usage.PromptTokens
			d.observe(cloud, r.req.Model, false, err, emitErr != nil || ctx.Err() != nil, m)
		}
		cloudDone <- outcome{res, err, emitErr != nil}
	}()

	select {
	case lerr := <-ready:
		if lerr == nil && claim(localWon) == localWon {
			cancelCloud()
			<-cloudDone
			d.stats.specCancelled.Add(1)
			res, err, final := r.try(ctx, local)
			return res, err, final, true
		}
		// The cloud already streams, or the local load failed: the cloud goes on.
		o := <-cloudDone
		if len(r.sent) > 0 || o.err == nil {
			d.stats.specKept.Add(1)
			return o.res, o.err, true, false
		}
		return inference.Result{}, o.err, o.last || ctx.Err() != nil, false
	case o := <-cloudDone:
		if len(r.sent) > 0 || o.err == nil || o.last || ctx.Err() != nil {
			if len(r.sent) > 0 || o.err == nil {
				d.stats.specKept.Add(1)
			}
			return o.res, o.err, true, false
		}
		// The cloud failed before its first token: local serves once loaded.
		select {
		case lerr := <-ready:
			if lerr != nil {
				return inference.Result{}, o.err, false, false
			}
		case <-ctx.Done():
			return inference.Result{}, ctx.Err(), true, false
		}
		res, err, final := r.try(ctx, local)
		return res, err, final, false
	}
}
