package bwprobe

import (
	"bytes"
	"errors"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// FuzzProbeFrame: any bytes, read as a control frame under the server's or the client's
// bound and decoded as a request or an answer, never panic nor read past the bound; a
// request the decoder accepts encodes back to the same bytes (one encoding per request)
// and is answered only within MaxProbeBytes; an answer is accept, a refusal with a code of
// inference's set, or a protocol error, nothing else.
func FuzzProbeFrame(f *testing.F) {
	for _, seed := range [][]byte{
		frame.Append(nil, encodeRequest(DefaultProbeBytes, DefaultProbeBytes)),
		frame.Append(nil, encodeRequest(MaxProbeBytes, 0)),
		frame.Append(nil, encodeRequest(MaxProbeBytes, 1)),
		frame.Append(nil, encodeRequest(1<<63, 1<<64-1)),
		frame.Append(nil, []byte{frameAccept}),
		frame.Append(nil, []byte{frameReceived}),
		frame.Append(nil, encodeRefuse(inference.CodeOverloaded)),
		frame.Append(nil, encodeRefuse("no such code")),
		{0x03, frameRequest, 0x80, 0x00},
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, max := range []int{MaxRequestFrame, MaxAnswerFrame} {
			r := bytes.NewReader(data)
			body, err := frame.ReadOne(r, max)
			if err != nil {
				continue
			}
			if len(body) > max || int(r.Size())-r.Len() != len(frame.Append(nil, body)) {
				t.Fatalf("read %d bytes of a %d-byte frame under a bound of %d", int(r.Size())-r.Len(), len(body), max)
			}
			if up, down, err := decodeRequest(body); err == nil {
				if again := encodeRequest(up, down); !bytes.Equal(again, body) {
					t.Fatalf("request %x decodes to (%d, %d), which encodes to %x", body, up, down, again)
				}
				if withinBounds(up, down) && up+down > MaxProbeBytes {
					t.Fatalf("(%d, %d) within the bounds", up, down)
				}
			} else if !errors.Is(err, errProtocol) {
				t.Fatalf("request %x: %v, want a protocol error", body, err)
			}
			switch err := decodeAnswer(body); {
			case err == nil:
				if !bytes.Equal(body, []byte{frameAccept}) {
					t.Fatalf("%x read as accept", body)
				}
			case errors.Is(err, errProtocol):
			default:
				if _, ok := inference.ParseCode(string(inference.CodeOf(err))); !ok || body[0] != frameRefuse {
					t.Fatalf("%x read as the refusal %v", body, err)
				}
			}
		}
	})
}
