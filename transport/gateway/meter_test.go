package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	keyA = "key_0000000a"
	keyB = "key_0000000b"
)

func openMeter(t *testing.T, dir string) *Meter {
	t.Helper()
	m, err := OpenMeter(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func event(key, outcome string, in, out int, ms int64) MeterEvent {
	return MeterEvent{Time: t0, KeyID: key, Model: "synth-tiny", Peer: "12D3KooWpeer", TokensIn: in, TokensOut: out,
		DurationMS: ms, Outcome: outcome}
}

func record(t *testing.T, m *Meter, events ...MeterEvent) {
	t.Helper()
	for _, e := range events {
		if err := m.Record(e); err != nil {
			t.Fatal(err)
		}
	}
}

// threeEvents are two completed tasks and one peer_lost for keyA, one completed for keyB.
var threeEvents = []MeterEvent{
	event(keyA, OutcomeCompleted, 12, 64, 800),
	event(keyA, OutcomeCompleted, 10, 32, 400),
	event(keyA, "peer_lost", 0, 5, 300),
	event(keyB, OutcomeCompleted, 7, 7, 100),
}

var wantA = Usage{Requests: 3, Completed: 2, Failed: 1, TokensIn: 22, TokensOut: 101, Duration: 1500 * time.Millisecond}
var wantB = Usage{Requests: 1, Completed: 1, TokensIn: 7, TokensOut: 7, Duration: 100 * time.Millisecond}

func TestMeterRecordsAndSums(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	m := openMeter(t, dir)
	record(t, m, threeEvents...)
	if got := m.Usage(keyA); got != wantA {
		t.Errorf("Usage(a) = %+v, want %+v", got, wantA)
	}
	if got := m.Usage(keyB); got != wantB {
		t.Errorf("Usage(b) = %+v, want %+v", got, wantB)
	}
	if got := m.Usage("key_ffffffff"); got != (Usage{}) {
		t.Errorf("Usage(unused key) = %+v, want zero", got)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	path := filepath.Join(dir, UsageFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", UsageFile, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != len(threeEvents) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(threeEvents), data)
	}
	want := `{"time":"2026-05-01T12:00:00Z","key_id":"key_0000000a","model":"synth-tiny","peer":"12D3KooWpeer",` +
		`"tokens_in":12,"tokens_out":64,"duration_ms":800,"verified":false,"outcome":"completed"}`
	if lines[0] != want {
		t.Errorf("first line\n%s\nwant\n%s", lines[0], want)
	}

	// Reopened: the totals include what the file held.
	again := openMeter(t, dir)
	record(t, again, event(keyA, OutcomeCompleted, 1, 1, 0))
	wantA2 := wantA
	wantA2.Requests, wantA2.Completed, wantA2.TokensIn, wantA2.TokensOut = 4, 3, 23, 102
	if got := again.Usage(keyA); got != wantA2 {
		t.Errorf("after reopening, Usage(a) = %+v, want %+v", got, wantA2)
	}
	totals, err := ReadUsage(path)
	if err != nil || totals[keyA] != wantA2 || totals[keyB] != wantB || len(totals) != 2 {
		t.Errorf("ReadUsage = %+v, %v; want a %+v and b %+v", totals, err, wantA2, wantB)
	}
}

// The metering rule of issue 7: a task that failed verification is metered as zero tokens,
// both in the file and in the sums, and counts as a failed request.
func TestMeterZeroesFailedVerification(t *testing.T) {
	dir := t.TempDir()
	m := openMeter(t, dir)
	liar := event(keyA, OutcomeVerificationFailed, 50, 400, 900)
	liar.Verified = true
	record(t, m, liar, event(keyA, OutcomeCompleted, 10, 20, 100))

	want := Usage{Requests: 2, Completed: 1, Failed: 1, TokensIn: 10, TokensOut: 20, Duration: time.Second}
	if got := m.Usage(keyA); got != want {
		t.Errorf("Usage = %+v, want %+v", got, want)
	}
	data, err := os.ReadFile(filepath.Join(dir, UsageFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"tokens_in":0,"tokens_out":0,"duration_ms":900,"verified":true,"outcome":"verification_failed"`) {
		t.Errorf("the failed verification is not written with zero tokens:\n%s", data)
	}

	// A line that says otherwise (written by hand) still sums to zero tokens.
	var u Usage
	u.Add(liar)
	if u.TokensIn != 0 || u.TokensOut != 0 || u.Failed != 1 {
		t.Errorf("Usage.Add(failed verification with tokens) = %+v, want no tokens, one failed", u)
	}
}

func TestMeterRecordRejects(t *testing.T) {
	m := openMeter(t, t.TempDir())
	tests := []struct {
		name   string
		change func(*MeterEvent)
	}{
		{"zero time", func(e *MeterEvent) { e.Time = time.Time{} }},
		{"no key", func(e *MeterEvent) { e.KeyID = "" }},
		{"not a key id", func(e *MeterEvent) { e.KeyID = "alice" }},
		{"a key, not its id", func(e *MeterEvent) { e.KeyID = KeyPrefix + strings.Repeat("a", 52) }},
		{"negative tokens", func(e *MeterEvent) { e.TokensIn = -1 }},
		{"negative duration", func(e *MeterEvent) { e.DurationMS = -1 }},
		{"no outcome", func(e *MeterEvent) { e.Outcome = "" }},
		{"outcome with spaces", func(e *MeterEvent) { e.Outcome = "went wrong" }},
		{"long model", func(e *MeterEvent) { e.Model = strings.Repeat("m", maxModel+1) }},
		{"long peer", func(e *MeterEvent) { e.Peer = strings.Repeat("p", maxPeer+1) }},
		{"long device", func(e *MeterEvent) { e.Device = strings.Repeat("d", MaxDeviceID+1) }},
		{"device with a space", func(e *MeterEvent) { e.Device = "my laptop" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := event(keyA, OutcomeCompleted, 1, 1, 1)
			tc.change(&e)
			if err := m.Record(e); err == nil {
				t.Errorf("Record(%+v) succeeded", e)
			}
		})
	}
	if got := m.Usage(keyA); got != (Usage{}) {
		t.Errorf("rejected events were counted: %+v", got)
	}
	// Control: the event unchanged, with an empty model and peer (a task refused before
	// routing), and a time in another zone, is recorded.
	e := event(keyA, "no_peer", 0, 0, 0)
	e.Model, e.Peer, e.Time = "", "", t0.In(time.FixedZone("CEST", 2*3600))
	if err := m.Record(e); err != nil {
		t.Errorf("Record(valid) = %v", err)
	}
}

// Each event keeps the device its client named; the meter sums each device of a key apart,
// in memory and again from the file, and an event without a device has no "device" field.
func TestMeterRecordsDevices(t *testing.T) {
	dir := t.TempDir()
	m := openMeter(t, dir)
	const laptop, phone = "dev_0123456789abcdef0123456789abcdef", "3f2a9c4e-5b1d-4c8e-9a7f-0d6b2e1c4a58"
	withDevice := func(e MeterEvent, device string) MeterEvent {
		e.Device = device
		return e
	}
	record(t, m,
		withDevice(event(keyA, OutcomeCompleted, 12, 64, 800), laptop),
		withDevice(event(keyA, OutcomeVerificationFailed, 5, 5, 100), laptop),
		withDevice(event(keyA, OutcomeCompleted, 10, 32, 400), phone),
		event(keyA, OutcomeCompleted, 1, 1, 10),
		withDevice(event(keyB, OutcomeCompleted, 7, 7, 100), laptop),
	)
	wantLaptop := Usage{Requests: 2, Completed: 1, Failed: 1, TokensIn: 12, TokensOut: 64, Duration: 900 * time.Millisecond}
	wantPhone := Usage{Requests: 1, Completed: 1, TokensIn: 10, TokensOut: 32, Duration: 400 * time.Millisecond}
	check := func(m *Meter, when string) {
		t.Helper()
		for _, tc := range []struct {
			key, device string
			want        Usage
		}{
			{keyA, laptop, wantLaptop}, {keyA, phone, wantPhone}, {keyB, laptop, wantB},
			{keyB, phone, Usage{}}, {keyA, "", Usage{}},
		} {
			if got := m.DeviceUsage(tc.key, tc.device); got != tc.want {
				t.Errorf("%s: DeviceUsage(%s, %q) = %+v, want %+v", when, tc.key, tc.device, got, tc.want)
			}
		}
		if got := m.Usage(keyA); got.Requests != 4 {
			t.Errorf("%s: Usage(a) = %+v, want 4 requests over all devices", when, got)
		}
	}
	check(m, "recorded")
	m.Close()
	check(openMeter(t, dir), "reopened")

	var devices []string
	if err := ReadEvents(filepath.Join(dir, UsageFile), func(e MeterEvent) { devices = append(devices, e.Device) }); err != nil {
		t.Fatal(err)
	}
	if want := []string{laptop, laptop, phone, "", laptop}; strings.Join(devices, ",") != strings.Join(want, ",") {
		t.Errorf("devices read back %q, want %q", devices, want)
	}
	data, err := os.ReadFile(filepath.Join(dir, UsageFile))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	if !strings.HasPrefix(lines[0], `{"time":"2026-05-01T12:00:00Z","key_id":"key_0000000a","device":"`+laptop+`","model":`) ||
		strings.Contains(lines[3], `"device"`) {
		t.Errorf("lines with and without a device:\n%s\n%s", lines[0], lines[3])
	}
}

// A crash mid-write leaves a torn last line: ReadUsage skips and reports it, OpenMeter skips
// it, and the next Record starts on a fresh line.
func TestReadUsageTornLastLine(t *testing.T) {
	dir := t.TempDir()
	m := openMeter(t, dir)
	record(t, m, threeEvents...)
	m.Close()
	path := filepath.Join(dir, UsageFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"time":"2026-05-01T12:05:00Z","key_id":"key_0000000a","model":"synth-ti`); err != nil {
		t.Fatal(err)
	}
	f.Close()

	totals, err := ReadUsage(path)
	bad, ok := errors.AsType[*BadLinesError](err)
	if !ok || bad.Count != 1 || len(bad.Lines) != 1 || bad.Lines[0] != 5 || bad.Path != path {
		t.Fatalf("ReadUsage error = %v, want a *BadLinesError for line 5 of %s", err, path)
	}
	if totals[keyA] != wantA || totals[keyB] != wantB {
		t.Errorf("ReadUsage totals with a torn line = %+v, want a %+v b %+v", totals, wantA, wantB)
	}

	m = openMeter(t, dir)
	if got := m.Usage(keyA); got != wantA {
		t.Errorf("OpenMeter on a torn log: Usage(a) = %+v, want %+v", got, wantA)
	}
	record(t, m, event(keyB, OutcomeCompleted, 1, 1, 0))
	m.Close()
	totals, err = ReadUsage(path)
	if bad, ok := errors.AsType[*BadLinesError](err); !ok || bad.Count != 1 {
		t.Errorf("after a Record, ReadUsage error = %v, want the torn line only", err)
	}
	if got := totals[keyB]; got.Requests != 2 {
		t.Errorf("the event after the torn line was lost: b = %+v", got)
	}
}

func TestReadUsageSkipsBadLines(t *testing.T) {
	good, err := json.Marshal(event(keyA, OutcomeCompleted, 1, 2, 3))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for i, line := range [][]byte{
		good,
		[]byte(`not json`),
		bytes.Repeat([]byte("x"), MaxUsageLine+10),                                       // too long
		[]byte(`{"time":"2026-05-01T12:00:00Z","key_id":"alice","outcome":"completed"}`), // not a key id
		nil, // empty lines are not errors
		good,
	} {
		if i > 0 {
			buf.WriteByte('\n')
		}
		buf.Write(line)
	}
	buf.WriteByte('\n')
	path := filepath.Join(t.TempDir(), UsageFile)
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	totals, err := ReadUsage(path)
	bad, ok := errors.AsType[*BadLinesError](err)
	if !ok || bad.Count != 3 || fmt.Sprint(bad.Lines) != "[2 3 4]" {
		t.Errorf("ReadUsage error = %v, want lines 2, 3 and 4 reported", err)
	}
	if got := totals[keyA]; got.Requests != 2 || got.TokensOut != 4 {
		t.Errorf("totals %+v, want the two good lines", got)
	}

	if _, err := ReadUsage(filepath.Join(t.TempDir(), UsageFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadUsage(missing) error = %v, want fs.ErrNotExist", err)
	}
}

func TestMeterClose(t *testing.T) {
	m := openMeter(t, t.TempDir())
	record(t, m, threeEvents[0])
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if err := m.Record(threeEvents[1]); !errors.Is(err, ErrMeterClosed) {
		t.Errorf("Record after Close = %v, want ErrMeterClosed", err)
	}
	if got := m.Usage(keyA); got.Requests != 1 {
		t.Errorf("Usage after Close = %+v, want the one event", got)
	}
}

// Concurrent Records never interleave lines and are all counted, in memory and in the file.
func TestMeterConcurrentRecords(t *testing.T) {
	dir := t.TempDir()
	m := openMeter(t, dir)
	const workers, each = 8, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			key := fmt.Sprintf("key_%08x", w%2)
			for range each {
				if err := m.Record(event(key, OutcomeCompleted, 1, 2, 1)); err != nil {
					t.Error(err)
					return
				}
				m.Usage(key)
			}
		})
	}
	wg.Wait()
	m.Close()
	totals, err := ReadUsage(filepath.Join(dir, UsageFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"key_00000000", "key_00000001"} {
		want := Usage{Requests: workers / 2 * each, Completed: workers / 2 * each, TokensIn: workers / 2 * each,
			TokensOut: 2 * workers / 2 * each, Duration: workers / 2 * each * time.Millisecond}
		if totals[key] != want || m.Usage(key) != want {
			t.Errorf("%s: file %+v, memory %+v; want %+v", key, totals[key], m.Usage(key), want)
		}
	}
}

func TestUsageHandler(t *testing.T) {
	dir := t.TempDir()
	ks := openKeys(t, dir)
	alice, ka := createKey(t, ks, "alice")
	bob, kb := createKey(t, ks, "bob")
	m := openMeter(t, dir)
	record(t, m, event(ka.ID, OutcomeCompleted, 12, 64, 800), event(ka.ID, OutcomeVerificationFailed, 5, 5, 100))
	h := RequireKey(ks, UsageHandler(m))

	get := func(method, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, "/v1/usage", nil)
		if key != "" {
			r.Header.Set("Authorization", "Bearer "+key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	type response struct {
		Object string `json:"object"`
		Key    struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		} `json:"key"`
		Usage  Usage `json:"usage"`
		Device *struct {
			ID    string `json:"id"`
			Usage Usage  `json:"usage"`
		} `json:"device"`
	}
	for _, tc := range []struct {
		plain string
		k     Key
		want  Usage
	}{
		{alice, ka, Usage{Requests: 2, Completed: 1, Failed: 1, TokensIn: 12, TokensOut: 64, Duration: 900 * time.Millisecond}},
		{bob, kb, Usage{}},
	} {
		w := get(http.MethodGet, tc.plain)
		var got response
		if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &got) != nil {
			t.Fatalf("GET /v1/usage as %s: status %d\n%s", tc.k.Name, w.Code, w.Body)
		}
		if got.Object != "meshinfer.usage" || got.Key.ID != tc.k.ID || got.Key.Name != tc.k.Name || got.Usage != tc.want {
			t.Errorf("GET /v1/usage as %s = %+v, want key %s usage %+v", tc.k.Name, got, tc.k.ID, tc.want)
		}
		if !strings.Contains(w.Body.String(), `"duration_ns":`) {
			t.Errorf("usage JSON has no duration_ns:\n%s", w.Body)
		}
		if got.Device != nil || strings.Contains(w.Body.String(), `"device"`) {
			t.Errorf("GET /v1/usage without a device names one:\n%s", w.Body)
		}
	}

	// With a device: the key's totals, and the device's part of them.
	const laptop = "dev_0123456789abcdef0123456789abcdef"
	ev := event(ka.ID, OutcomeCompleted, 3, 4, 50)
	ev.Device = laptop
	record(t, m, ev)
	r := httptest.NewRequest(http.MethodGet, "/v1/usage", nil)
	r.Header.Set("Authorization", "Bearer "+alice)
	r.Header.Set(DeviceHeader, laptop)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var got response
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &got) != nil {
		t.Fatalf("GET /v1/usage with a device: status %d\n%s", w.Code, w.Body)
	}
	wantDevice := Usage{Requests: 1, Completed: 1, TokensIn: 3, TokensOut: 4, Duration: 50 * time.Millisecond}
	if got.Usage.Requests != 3 || got.Device == nil || got.Device.ID != laptop || got.Device.Usage != wantDevice {
		t.Errorf("GET /v1/usage with a device = %+v, want 3 requests for the key, device %s with %+v", got, laptop, wantDevice)
	}
	r.Header.Set(DeviceHeader, "my laptop")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), DeviceHeader) {
		t.Errorf("GET /v1/usage with a malformed device: status %d\n%s", w.Code, w.Body)
	}
	if w := get(http.MethodGet, ""); w.Code != http.StatusUnauthorized {
		t.Errorf("GET /v1/usage without a key: status %d, want 401", w.Code)
	}
	if w := get(http.MethodPost, alice); w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /v1/usage: status %d Allow %q, want 405 and GET, HEAD", w.Code, w.Header().Get("Allow"))
	}

	// Mounted without RequireKey: a wiring mistake, refused rather than answered for no key.
	w = httptest.NewRecorder()
	UsageHandler(m).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/usage", nil))
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("UsageHandler without a session: status %d, want 503", w.Code)
	}
}

// The meter remembers which gateway runs it metered as ended with their result, across a
// reopen (a restart), within the result cache's age; failed runs, events without a run and
// a refused idempotency value are not remembered.
func TestMeterBilledRuns(t *testing.T) {
	dir := t.TempDir()
	m := openMeter(t, dir)
	run := func(n int) string { return fmt.Sprintf("%064x", n) }
	done, failed, judged, plain := event(keyA, OutcomeCompleted, 1, 2, 3), event(keyA, "peer_lost", 1, 0, 3),
		event(keyA, OutcomeVerificationFailed, 1, 2, 3), event(keyA, OutcomeCompleted, 1, 2, 3)
	done.Idempotency, failed.Idempotency, judged.Idempotency = run(1), run(2), run(3)
	record(t, m, done, failed, judged, plain)
	bad := done
	bad.Idempotency = "not hex"
	if err := m.Record(bad); err == nil {
		t.Fatal("an idempotency that is not a hex SHA-256 was recorded")
	}
	m.Close()
	m = openMeter(t, dir)
	for _, tt := range []struct {
		run  string
		now  time.Time
		want bool
	}{
		{run(1), t0, true},
		{run(1), t0.Add(cacheTTL), true},
		{run(1), t0.Add(cacheTTL + time.Second), false},
		{run(2), t0, false},
		{run(3), t0, true},
		{run(4), t0, false},
	} {
		if got := m.Billed(tt.run, tt.now); got != tt.want {
			t.Errorf("Billed(%s, +%v) = %v, want %v", tt.run[56:], tt.now.Sub(t0), got, tt.want)
		}
	}
	// Bounded: past maxBilled runs, the oldest are forgotten (counted in memory only here).
	for i := range maxBilled {
		e := event(keyA, OutcomeCompleted, 1, 1, 1)
		e.Idempotency = run(100 + i)
		m.add(e)
	}
	if m.Billed(run(1), t0) || !m.Billed(run(100), t0) || len(m.billed) != maxBilled || len(m.billedOrder) != maxBilled {
		t.Fatalf("after %d more runs: run 1 %v, run 100 %v, %d remembered", maxBilled, m.Billed(run(1), t0), m.Billed(run(100), t0), len(m.billed))
	}
}
