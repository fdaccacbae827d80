package mux

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"io"
	"math/big"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-yamux/v5"
)

// BenchmarkCrossing measures the one-way delay of a 100-byte write, 2 ms after the previous
// one (as tokens come), on three paths over TLS 1.3 on TCP loopback, interleaved: the bare
// TLS connection (the reference), a stream of this package, a yamux stream. Each op is one
// write on each path; read the p50s and the ratios, not ns/op:
//
//	go test -run='^$' -bench=Crossing -benchtime=300x ./transport/mux/
func BenchmarkCrossing(b *testing.B) {
	cert := benchCert(b)
	pair := func() (net.Conn, net.Conn) {
		c, s := tcpPair(b)
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
		ts := tls.Server(s, &tls.Config{Certificates: []tls.Certificate{cert}})
		errc := make(chan error, 1)
		go func() { errc <- ts.Handshake() }()
		if err := tc.Handshake(); err != nil {
			b.Fatal(err)
		}
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { tc.Close(); ts.Close() })
		return tc, ts
	}

	type path struct {
		name string
		w    io.Writer
		r    io.Reader
	}
	var paths []path
	tc, ts := pair()
	paths = append(paths, path{"tls", tc, ts})

	mc, ms := pair()
	ma, mb := newConn(mc, false, &Transport{}), newConn(ms, true, &Transport{})
	b.Cleanup(func() { ma.Close(); mb.Close() })
	w, r := benchStreams(b, ma, mb)
	paths = append(paths, path{"mux", w, r})

	yc, ys := pair()
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	ya, err := yamux.Client(yc, cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	yb, err := yamux.Server(ys, cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ya.Close(); yb.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		s, err := yb.AcceptStream()
		if err == nil {
			accepted <- s
		}
		close(accepted)
	}()
	yw, err := ya.OpenStream(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	yw.Write(make([]byte, 1)) // yamux announces a stream with its first frame
	yr := <-accepted
	io.ReadFull(yr, make([]byte, 1))
	paths = append(paths, path{"yamux", yw, yr})

	// One reader per path, for the whole run, as a client reading a token stream.
	epoch := time.Now()
	arrived := make([]chan float64, len(paths))
	for i, p := range paths {
		arrived[i] = make(chan float64)
		go func() {
			defer close(arrived[i])
			got := make([]byte, 100)
			for {
				if _, err := io.ReadFull(p.r, got); err != nil {
					return // the cleanup closed the path
				}
				arrived[i] <- float64(time.Since(epoch)-time.Duration(binary.BigEndian.Uint64(got))) / 1e3
			}
		}()
	}
	delays := make([][]float64, len(paths))
	buf := make([]byte, 100)
	for n := range b.N + 20 { // the first 20 warm up
		for i, p := range paths {
			time.Sleep(2 * time.Millisecond)
			binary.BigEndian.PutUint64(buf, uint64(time.Since(epoch)))
			if _, err := p.w.Write(buf); err != nil {
				b.Fatal(err)
			}
			d, ok := <-arrived[i]
			if !ok {
				b.Fatalf("%s: read failed", p.name)
			}
			if n >= 20 {
				delays[i] = append(delays[i], d)
			}
		}
	}
	p50 := make([]float64, len(paths))
	for i := range paths {
		slices.Sort(delays[i])
		p50[i] = delays[i][len(delays[i])/2]
		b.ReportMetric(p50[i], paths[i].name+"-p50-µs")
	}
	b.ReportMetric(p50[1]/p50[0], "mux/tls")
	b.ReportMetric(p50[2]/p50[0], "yamux/tls")
	fmt.Printf("one-way p50: tls %.1f µs, mux %.1f µs (%.2f×), yamux %.1f µs (%.2f×)\n",
		p50[0], p50[1], p50[1]/p50[0], p50[2], p50[2]/p50[0])
}

// benchStreams opens a stream on a and accepts it on b.
func benchStreams(b *testing.B, a, c *Conn) (network.MuxedStream, network.MuxedStream) {
	s, err := a.OpenStream(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	r, err := c.AcceptStream()
	if err != nil {
		b.Fatal(err)
	}
	return s, r
}

func benchCert(b *testing.B) tls.Certificate {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
	if err != nil {
		b.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
}
