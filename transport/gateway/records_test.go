package gateway

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// rec is a record of run number n, completed at at, with tokens.
func rec(n int, at time.Time, tokens ...string) idemRecord {
	return idemRecord{Time: at, Run: fmt.Sprintf("%064x", n), Digest: strings.Repeat("ab", 32), Tokens: tokens,
		Finish: "stop", Usage: json.RawMessage(`{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}`)}
}

func openRecordsT(t *testing.T, dir string, now time.Time) (*records, []idemRecord) {
	t.Helper()
	s, live, err := openRecords(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.close() })
	return s, live
}

func putT(t *testing.T, s *records, now time.Time, rcs ...idemRecord) {
	t.Helper()
	for _, rc := range rcs {
		if err := s.put(rc, now); err != nil {
			t.Fatal(err)
		}
	}
}

func runsOf(rcs []idemRecord) []string {
	var out []string
	for _, rc := range rcs {
		out = append(out, rc.Run[56:])
	}
	return out
}

// Records written are read back after a reopen, in order and whole; a torn last line (a
// crash mid-write) and an altered line are dropped without failing, and the file is left
// holding the good records only, so the next append starts clean.
func TestRecordsReopenTornAndCorrupt(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, IdempotencyFile)
	s, live := openRecordsT(t, dir, t0)
	if len(live) != 0 {
		t.Fatalf("a new file has %d records", len(live))
	}
	want := []idemRecord{rec(1, t0, "Hel", "lo"), rec(2, t0.Add(time.Second)), rec(3, t0.Add(2*time.Second), "x")}
	putT(t, s, t0, want...)
	s.close()
	if err := s.put(rec(9, t0), t0); err == nil {
		t.Fatal("put after close succeeded")
	}

	// An altered line between good ones, then a torn last line.
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	good, _ := json.Marshal(rec(4, t0.Add(3*time.Second), "y"))
	fmt.Fprintf(f, "{\"time\":\"not a time\"}\n%s\n{\"time\":\"2026-05-01T12:00:04Z\",\"run\":\"00", good)
	f.Close()
	want = append(want, rec(4, t0.Add(3*time.Second), "y"))

	now := t0.Add(time.Minute)
	s, live = openRecordsT(t, dir, now)
	if !reflect.DeepEqual(live, want) {
		t.Fatalf("read back\n%+v\nwant\n%+v", live, want)
	}
	b, _ := os.ReadFile(path)
	if n := strings.Count(string(b), "\n"); n != len(want) || b[len(b)-1] != '\n' {
		t.Fatalf("rewritten file has %d lines:\n%s", n, b)
	}
	putT(t, s, now, rec(5, now))
	s.close()
	_, live = openRecordsT(t, dir, now)
	if got := runsOf(live); !reflect.DeepEqual(got, []string{"00000001", "00000002", "00000003", "00000004", "00000005"}) {
		t.Fatalf("after an append: %v", got)
	}
}

// The bounds: a record older than the cache's age (or from the future) is dropped, a run's
// last record wins, only the newest cacheEntries are kept, a result too large for a line is
// kept without its tokens, and a full file is compacted to its live records before the
// next append.
func TestRecordsBounds(t *testing.T) {
	t.Run("age, future and last wins", func(t *testing.T) {
		dir := t.TempDir()
		s, _ := openRecordsT(t, dir, t0)
		putT(t, s, t0, rec(1, t0), rec(2, t0.Add(time.Minute), "old"), rec(3, t0.Add(time.Hour)),
			rec(2, t0.Add(2*time.Minute), "new"))
		s.close()
		_, live := openRecordsT(t, dir, t0.Add(time.Minute+cacheTTL))
		if len(live) != 1 || live[0].Run != rec(2, t0).Run || live[0].Tokens[0] != "new" {
			t.Fatalf("live: %+v", live)
		}
	})
	t.Run("count", func(t *testing.T) {
		dir := t.TempDir()
		var b strings.Builder
		for i := range cacheEntries + 10 {
			line, _ := json.Marshal(rec(i, t0.Add(time.Duration(i)*time.Millisecond), "t"))
			b.Write(line)
			b.WriteByte('\n')
		}
		if err := os.WriteFile(filepath.Join(dir, IdempotencyFile), []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		_, live := openRecordsT(t, dir, t0.Add(2*time.Second))
		if len(live) != cacheEntries || live[0].Run != rec(10, t0).Run || live[len(live)-1].Run != rec(cacheEntries+9, t0).Run {
			t.Fatalf("%d live, from %s to %s", len(live), live[0].Run, live[len(live)-1].Run)
		}
	})
	t.Run("too large", func(t *testing.T) {
		dir := t.TempDir()
		s, _ := openRecordsT(t, dir, t0)
		big := make([]string, maxRecordLine/8)
		for i := range big {
			big[i] = "tokens"
		}
		putT(t, s, t0, rec(1, t0, big...))
		s.close()
		_, live := openRecordsT(t, dir, t0)
		if len(live) != 1 || !live[0].Dropped || live[0].Tokens != nil {
			t.Fatalf("a result too large: %d records, dropped %v", len(live), len(live) > 0 && live[0].Dropped)
		}
	})
	t.Run("compaction", func(t *testing.T) {
		dir := t.TempDir()
		s, _ := openRecordsT(t, dir, t0)
		line, _ := json.Marshal(rec(0, t0, "abc"))
		s.max = int64(10 * (len(line) + 1)) // ten records; compaction keeps five
		for i := range 30 {
			putT(t, s, t0, rec(i, t0, "abc"))
			if n := s.bytes.Load(); n > s.max {
				t.Fatalf("after record %d the file is %d bytes, bound %d", i, n, s.max)
			}
		}
		st, err := os.Stat(filepath.Join(dir, IdempotencyFile))
		if err != nil || st.Size() != s.bytes.Load() {
			t.Fatalf("file size %v (%v), counted %d", st.Size(), err, s.bytes.Load())
		}
		s.close()
		_, live := openRecordsT(t, dir, t0)
		if got := runsOf(live); len(got) < 5 || got[len(got)-1] != "0000001d" {
			t.Fatalf("after compactions: %v", got)
		}
	})
}

// A coordinator restarted on the same data dir answers the resubmission of a request that
// completed before the restart from its record, without running or metering it again; the
// same key with another request is still refused; a request its meter says completed but
// whose output was not kept gets coordinator_lost; a request never seen runs.
func TestWSResubmissionAfterRestart(t *testing.T) {
	data := t.TempDir()
	ks := openKeys(t, t.TempDir())
	key, k := createKey(t, ks, "alice")
	m := openMeter(t, t.TempDir())
	d := newWSDispatcher(t)

	before := startWSKeys(t, d, ks, key, WithRecords(data, m))
	rc := before.mustDial(t)
	rc.request("a", "done-before", chatBody(5, 20), nil)
	first := rc.collect("a")["a"]
	if first.done == nil {
		t.Fatalf("first: %+v", first.err)
	}
	rc.c.CloseNow() // else Close waits for the close handshake nobody reads
	if err := before.ws.Close(); err != nil {
		t.Fatal(err)
	}
	// A task the meter holds but whose record was lost (the crash came between the two).
	billed := event(k.ID, OutcomeCompleted, 3, 4, 10)
	billed.Time = time.Now() // the endpoint's clock
	billed.Idempotency = runKey(Session{KeyID: k.ID}, "billed-only")
	record(t, m, billed)

	after := startWSKeys(t, d, ks, key, WithRecords(data, m))
	if n := after.ws.Restored(); n != 1 {
		t.Fatalf("restored %d records, want 1", n)
	}
	rc = after.mustDial(t)
	rc.request("a", "done-before", chatBody(5, 20), nil)
	rc.request("b", "done-before", chatBody(6, 20), nil)
	rc.request("c", "billed-only", chatBody(7, 20), nil)
	rc.request("d", "never-seen", chatBody(8, 20), nil)
	got := rc.collect("a", "b", "c", "d")
	if a := got["a"]; a.done == nil || a.text() != first.text() || string(a.done.Usage) != string(first.done.Usage) {
		t.Fatalf("replay after the restart: %+v, want %+v", a, first)
	}
	if b := got["b"]; b.err == nil || b.err.Code != "invalid_request" {
		t.Fatalf("the key with another request: %+v", b)
	}
	if c := got["c"]; c.err == nil || c.err.Code != "coordinator_lost" || !strings.Contains(c.err.Message, "billed") {
		t.Fatalf("billed, not kept: %+v", c)
	}
	if dd := got["d"]; dd.done == nil {
		t.Fatalf("a new request: %+v", dd.err)
	}
	if n := d.calls.Load(); n != 2 { // "a" before the restart, "d" after
		t.Fatalf("the dispatcher served %d requests, want 2", n)
	}
}
