package gateway

import (
	"bufio"
	"encoding/binary"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// WebSocket frames by hand (RFC 6455 §5.2), for clients that break the rules a library
// client keeps: partial frames, stalls, anything a fuzzer makes.

// WebSocket opcodes.
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xa
)

// clientMask is the masking key of every frame clientFrame builds.
var clientMask = [4]byte{0x37, 0xfa, 0x21, 0x3d}

// clientFrame is a client's frame: masked, with opcode op, FIN set if fin, declaring
// length declared and carrying payload (declared > len(payload) makes a partial frame).
func clientFrame(op byte, fin bool, payload []byte, declared int) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	f := []byte{b0}
	switch {
	case declared < 126:
		f = append(f, 0x80|byte(declared))
	case declared <= 0xffff:
		f = append(f, 0x80|126)
		f = binary.BigEndian.AppendUint16(f, uint16(declared))
	default:
		f = append(f, 0x80|127)
		f = binary.BigEndian.AppendUint64(f, uint64(declared))
	}
	f = append(f, clientMask[:]...)
	for i, c := range payload {
		f = append(f, c^clientMask[i%4])
	}
	return f
}

// serverFrame is one frame a server sent.
type serverFrame struct {
	op      byte
	fin     bool
	payload []byte
}

// parseServerFrames splits what a server wrote into its frames (unmasked, as a server's
// are); rest is an incomplete last frame, if any.
func parseServerFrames(b []byte) (frames []serverFrame, rest []byte) {
	for len(b) >= 2 {
		op, fin, n, hdr := b[0]&0x0f, b[0]&0x80 != 0, uint64(b[1]&0x7f), 2
		switch n {
		case 126:
			if len(b) < 4 {
				return frames, b
			}
			n, hdr = uint64(binary.BigEndian.Uint16(b[2:])), 4
		case 127:
			if len(b) < 10 {
				return frames, b
			}
			n, hdr = binary.BigEndian.Uint64(b[2:]), 10
		}
		if b[1]&0x80 != 0 || uint64(len(b)-hdr) < n {
			return frames, b // masked (not a server's) or incomplete
		}
		frames = append(frames, serverFrame{op: op, fin: fin, payload: b[hdr : hdr+int(n)]})
		b = b[hdr+int(n):]
	}
	return frames, b
}

// upgradeHeader is the header of a valid upgrade request to the gateway with key.
func upgradeHeader(key string) http.Header {
	return http.Header{
		"Authorization":         {"Bearer " + key},
		"Connection":            {"Upgrade"},
		"Upgrade":               {"websocket"},
		"Sec-Websocket-Version": {"13"},
		"Sec-Websocket-Key":     {"dGhlIHNhbXBsZSBub25jZQ=="},
	}
}

// rawDial opens a TCP connection to the fixture and upgrades it by hand; what follows the
// 101 is read from the returned reader.
func (f *wsFixture) rawDial(t *testing.T) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(f.base, "http://"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req, _ := http.NewRequest(http.MethodGet, f.base+WebSocketPath, nil)
	req.Header = upgradeHeader(f.key)
	if err := req.Write(c); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, req)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v, %v", resp, err)
	}
	return c, br
}

// A client that starts a message and stalls, or trickles the rest of it, is cut at the
// message timeout (slowloris on the WebSocket), although the idle timeout is far off; the
// same client's complete messages are answered.
func TestWSStalledMessageIsCut(t *testing.T) {
	const timeout = 200 * time.Millisecond
	f := startWS(t, newWSDispatcher(t), WithIdleTimeout(time.Hour), WithMessageTimeout(timeout))
	ping := []byte(`{"type":"ping","ts":7}`)
	for _, tt := range []struct {
		name    string
		send    []byte // after a complete ping
		trickle bool   // then a byte every few milliseconds
	}{
		{"partial frame, then nothing", clientFrame(opText, true, ping[:5], len(ping)), false},
		{"partial frame, trickled", clientFrame(opText, true, ping[:5], MaxMessageBytes), true},
		{"first fragment, then nothing", clientFrame(opText, false, ping[:5], 5), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, br := f.rawDial(t)
			if _, err := c.Write(clientFrame(opText, true, ping, len(ping))); err != nil {
				t.Fatal(err)
			}
			frames, _ := readFrames(t, c, br, 1)
			if len(frames) != 1 || frames[0].op != opText || !strings.Contains(string(frames[0].payload), `"pong"`) {
				t.Fatalf("a complete ping got %+v", frames)
			}
			start := time.Now()
			if _, err := c.Write(tt.send); err != nil {
				t.Fatal(err)
			}
			if tt.trickle {
				go func() { // ends at the first failed write: the server cut, or the test closed, c
					for {
						if _, err := c.Write([]byte{'x' ^ clientMask[0]}); err != nil {
							return
						}
						time.Sleep(timeout / 10) // pacing only: the test waits on the cut
					}
				}()
			}
			frames, err := readFrames(t, c, br, -1)
			if err == nil || len(frames) != 0 {
				t.Fatalf("the server sent %+v and %v instead of cutting the connection", frames, err)
			}
			took := time.Since(start)
			if took < timeout {
				t.Fatalf("cut after %v, before the message timeout %v", took, timeout)
			}
			t.Logf("figure F4: WebSocket, %s: cut after %v (message timeout %v, idle timeout 1 h)", tt.name, took.Round(time.Millisecond), timeout)
		})
	}
}

// readFrames reads the server's frames until n have come (n < 0: until the connection
// ends) and returns them and the error that ended the read, if any. A minute without the
// server closing fails the test.
func readFrames(t *testing.T, c net.Conn, br *bufio.Reader, n int) ([]serverFrame, error) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	defer c.SetReadDeadline(time.Time{})
	var buf []byte
	for {
		frames, _ := parseServerFrames(buf)
		if n >= 0 && len(frames) >= n {
			return frames, nil
		}
		b := make([]byte, 4096)
		k, err := br.Read(b)
		buf = append(buf, b[:k]...)
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the server neither answered nor closed the connection in a minute")
		}
		if err != nil {
			frames, _ := parseServerFrames(buf)
			return frames, err
		}
	}
}
