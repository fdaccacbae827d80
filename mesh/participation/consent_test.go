package participation

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConsentRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data") // does not exist yet
	if _, ok, err := LoadConsent(dir); ok || err != nil {
		t.Fatalf("LoadConsent before any consent: ok %v, err %v; want false, nil", ok, err)
	}
	want := Consent{
		Version: ConsentVersion, GivenAt: time.Date(2025, 3, 4, 5, 6, 7, 8, time.FixedZone("x", 3600)),
		RunLocal: true, Contribute: true, CloudFallback: false, BatteryFloor: 42, PauseOnMetered: true,
	}
	if err := SaveConsent(dir, want); err != nil {
		t.Fatalf("SaveConsent: %v", err)
	}
	got, ok, err := LoadConsent(dir)
	if err != nil || !ok {
		t.Fatalf("LoadConsent: ok %v, err %v", ok, err)
	}
	if !got.GivenAt.Equal(want.GivenAt) {
		t.Fatalf("GivenAt = %v, want %v", got.GivenAt, want.GivenAt)
	}
	got.GivenAt = want.GivenAt
	if got != want {
		t.Fatalf("LoadConsent = %+v, want %+v", got, want)
	}

	st, err := os.Stat(filepath.Join(dir, ConsentFile))
	if err != nil {
		t.Fatalf("stat: %v", err)
	}
	if perm := st.Mode().Perm(); perm != 0o600 {
		t.Fatalf("consent file mode %04o, want 0600", perm)
	}
	dst, err := os.Stat(dir)
	if err != nil {
		t.Fatalf("stat dir: %v", err)
	}
	if perm := dst.Mode().Perm(); perm != 0o700 {
		t.Fatalf("data dir mode %04o, want 0700", perm)
	}
	raw, err := os.ReadFile(filepath.Join(dir, ConsentFile))
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	for _, key := range []string{`"version"`, `"given_at"`, `"run_local"`, `"contribute"`, `"cloud_fallback"`, `"battery_floor"`, `"pause_on_metered"`} {
		if !strings.Contains(string(raw), key) {
			t.Errorf("consent file lacks %s:\n%s", key, raw)
		}
	}

	// Saving again replaces the record and leaves no temporary file behind.
	want.Contribute = false
	if err := SaveConsent(dir, want); err != nil {
		t.Fatalf("SaveConsent again: %v", err)
	}
	if got, _, _ := LoadConsent(dir); got.Contribute {
		t.Fatalf("second SaveConsent did not replace the record: %+v", got)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Fatalf("data dir holds %v (err %v), want only %s", entries, err, ConsentFile)
	}

	if err := WithdrawConsent(dir); err != nil {
		t.Fatalf("WithdrawConsent: %v", err)
	}
	if _, ok, err := LoadConsent(dir); ok || err != nil {
		t.Fatalf("LoadConsent after withdrawal: ok %v, err %v; want false, nil", ok, err)
	}
	if err := WithdrawConsent(dir); err != nil {
		t.Fatalf("WithdrawConsent with nothing recorded: %v", err)
	}
	if err := WithdrawConsent(filepath.Join(dir, "absent")); err != nil {
		t.Fatalf("WithdrawConsent in an absent dir: %v", err)
	}
}

func TestSaveConsentRejects(t *testing.T) {
	ok := Consent{Version: ConsentVersion, GivenAt: t0, Contribute: true, BatteryFloor: 30}
	tests := []struct {
		name   string
		mutate func(*Consent)
		want   string
	}{
		{"old version", func(c *Consent) { c.Version = 0 }, "version"},
		{"new version", func(c *Consent) { c.Version = ConsentVersion + 1 }, "version"},
		{"no time", func(c *Consent) { c.GivenAt = time.Time{} }, "given_at"},
		{"floor below 0", func(c *Consent) { c.BatteryFloor = -1 }, "battery_floor"},
		{"floor above 100", func(c *Consent) { c.BatteryFloor = 101 }, "battery_floor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			c := ok
			tt.mutate(&c)
			wantErr(t, SaveConsent(dir, c), tt.want)
			if _, err := os.Stat(filepath.Join(dir, ConsentFile)); !os.IsNotExist(err) {
				t.Fatalf("a rejected record was written (stat err %v)", err)
			}
		})
	}
}

func TestLoadConsentBad(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    string
	}{
		{"older version", `{"version": 0, "given_at": "2025-01-01T00:00:00Z", "contribute": true}`, "version 0"},
		{"newer version", `{"version": 2, "given_at": "2025-01-01T00:00:00Z", "contribute": true, "new_field": 1}`, "version 2"},
		{"no version", `{"given_at": "2025-01-01T00:00:00Z", "contribute": true}`, "malformed"},
		{"syntax", `{"version": 1,`, "malformed"},
		{"not an object", `[1]`, "malformed"},
		{"unknown field", `{"version": 1, "given_at": "2025-01-01T00:00:00Z", "contribute": true, "extra": 1}`, "extra"},
		{"wrong type", `{"version": 1, "given_at": "2025-01-01T00:00:00Z", "contribute": "yes"}`, "malformed"},
		{"no time", `{"version": 1, "contribute": true}`, "given_at"},
		{"bad floor", `{"version": 1, "given_at": "2025-01-01T00:00:00Z", "battery_floor": 300}`, "battery_floor"},
		{"trailing", `{"version": 1, "given_at": "2025-01-01T00:00:00Z"} {}`, "malformed"},
		{"empty", ``, "malformed"},
		{"too large", `{"version": 1, "given_at": "2025-01-01T00:00:00Z"}` + strings.Repeat(" ", maxConsentFile), "64 KiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, ConsentFile)
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatalf("write: %v", err)
			}
			c, ok, err := LoadConsent(dir)
			wantErr(t, err, tt.want, path, "meshinfer consent")
			if ok || c != (Consent{}) {
				t.Fatalf("LoadConsent returned ok %v, %+v with its error; want false and zero", ok, c)
			}
		})
	}
}

func TestConsentWording(t *testing.T) {
	if ConsentVersion != 1 {
		t.Fatalf("ConsentVersion = %d: a new wording needs a new version, and this test the new text", ConsentVersion)
	}
	for _, part := range []string{
		"Run models locally", "Contribute to the mesh", "Allow cloud fallback",
		"default 30 %", "metered", "default: yes", "meshinfer consent --withdraw",
	} {
		if !strings.Contains(ConsentWording, part) {
			t.Errorf("ConsentWording does not mention %q", part)
		}
	}
	if DefaultBatteryFloor != 30 || !DefaultPauseOnMetered {
		t.Fatalf("defaults %d %% / %v disagree with the wording", DefaultBatteryFloor, DefaultPauseOnMetered)
	}
}

func TestOwnerPolicy(t *testing.T) {
	c := Consent{Version: ConsentVersion, GivenAt: t0, Contribute: true, BatteryFloor: 55, PauseOnMetered: true}
	p := c.OwnerPolicy()
	want := Policy{BatteryMinLevel: 55, ThermalMaxState: "critical", PauseOnMetered: true}
	if p != want {
		t.Fatalf("OwnerPolicy = %+v, want %+v", p, want)
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("OwnerPolicy invalid: %v", err)
	}
}

// FuzzDecodeConsent: any input either fails or yields a record that SaveConsent accepts.
func FuzzDecodeConsent(f *testing.F) {
	f.Add([]byte(`{"version":1,"given_at":"2025-01-01T00:00:00Z","contribute":true,"battery_floor":30}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := decodeConsent(data)
		if err != nil {
			return
		}
		if err := c.validate(); err != nil {
			t.Fatalf("decoded %q to %+v, which SaveConsent rejects: %v", data, c, err)
		}
	})
}

// A consent record that is a symbolic link is refused, not followed (issue 19).
func TestLoadConsentRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	elsewhere := filepath.Join(t.TempDir(), "consent.json")
	if err := os.WriteFile(elsewhere, []byte(`{"version":1,"contribute":true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(dir, ConsentFile)); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := LoadConsent(dir); err == nil || ok || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("LoadConsent through a symlink: ok %v, %v; want refused", ok, err)
	}
}
