package webrtc

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// With no candidate on one side ICE cannot connect: OpenStream fails with ErrSetupTimeout
// at ConnectTimeout, nothing is kept on either side, and once both Transports and hosts
// are closed no goroutine is left.
func TestICEBlockedTimesOut(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ha, hb := newHost(t), newHost(t)
	connect(t, ha, hb)
	blocked := DefaultSettingEngine()
	blocked.SetIPFilter(func(net.IP) bool { return false })
	const timeout = time.Second
	a, err := New(ha, Config{SettingEngine: blocked, ConnectTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	cb := accepting()
	cb.ConnectTimeout = timeout
	b, err := New(hb, cb)
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	_, _, err = a.OpenStream(context.Background(), hb.ID())
	d := time.Since(start)
	if !errors.Is(err, ErrSetupTimeout) {
		t.Fatalf("err %v, want ErrSetupTimeout", err)
	}
	if d < timeout || d > timeout+time.Second {
		t.Fatalf("failed after %v, want ConnectTimeout (%v)", d, timeout)
	}
	if st := a.Stats(); st.Open != 0 || st.SetupFailures != 1 {
		t.Fatalf("offerer stats %+v, want nothing open and one failure", st)
	}
	waitSetupsDone(t, b) // the answerer gave up
	if st := b.Stats(); st.Open != 0 || st.Accepted != 0 {
		t.Fatalf("answerer stats %+v, want nothing kept", st)
	}
	a.Close()
	b.Close()
	ha.Close()
	hb.Close()
}
