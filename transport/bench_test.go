package transport

import (
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// F4 (docs/reliability.md) on real loopback: the p99 latency of an honest client's requests
// while 64 slowloris connections from another address hold the server (each trickling a
// header, cut at the deadline, connecting again), as a ratio to the p99 without them,
// measured in the same run (and the p50's, steadier on a shared machine). The goal is 1.2 at
// most.
func BenchmarkHonestUnderSlowloris(b *testing.B) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ln := apiLimits.Listener(tcp)
	srv := apiLimits.Server(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	served := make(chan struct{})
	go func() { // ends with Close below
		defer close(served)
		srv.Serve(ln)
	}()
	defer func() {
		srv.Close()
		<-served
	}()
	addr := tcp.Addr().String()
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	// quantiles returns the p50 and p99 of a run of honest requests.
	quantiles := func() (time.Duration, time.Duration) {
		lat := make([]time.Duration, max(b.N, 1000))
		for i := range lat {
			start := time.Now()
			resp, err := hc.Get("http://" + addr + "/")
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			lat[i] = time.Since(start)
		}
		slices.Sort(lat)
		return lat[len(lat)/2], lat[len(lat)*99/100]
	}

	b.ResetTimer()
	base50, base := quantiles()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() { // ends with stop
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}
			for {
				c, err := d.Dial("tcp", addr)
				if err != nil {
					return
				}
				for i := 0; ; i++ {
					if _, err := c.Write([]byte{"GET / HTTP/1.1\r\nX: "[min(i, 18)]}); err != nil {
						break // cut at the header deadline: connect again
					}
					select {
					case <-stop:
						c.Close()
						return
					case <-time.After(50 * time.Millisecond):
					}
				}
				c.Close()
			}
		})
	}
	for ln.Open() < 64+1 { // every attacker held, besides the honest connection
		time.Sleep(time.Millisecond)
	}
	under50, under := quantiles()
	close(stop)
	wg.Wait()
	b.ReportMetric(float64(under)/float64(base), "p99-ratio")
	b.ReportMetric(float64(under50)/float64(base50), "p50-ratio")
	b.ReportMetric(float64(base.Microseconds()), "base-p99-µs")
}
