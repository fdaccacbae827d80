package participation

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

func TestConsentRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data") // does not exist yet
	if _, ok, err := LoadConsent(dir); ok || err != nil {
		t.Fatalf("LoadConsent before any consent: ok %v, err %v; want false, nil", ok, err)
	}
	want := Consent{
		Version: ConsentVersion, GivenAt: time.Date(2025, 3, 4, 5, 6, 7, 8, time.FixedZone("x", 3600)),
		RunLocal: true, Contribute: true, CloudFallback: false, BatteryFloor: 42, PauseOnMetered: true,
		RequireCharging: true, ThermalMaxState: caps.ThermalFair, MaxTasksPerMin: 12, MaxBytesPerHour: 3_000_000_000,
		MaxMemoryShare: 35, WordingSHA256: WordingHash("our own words\n"),
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
	for _, key := range []string{`"version"`, `"given_at"`, `"run_local"`, `"contribute"`, `"cloud_fallback"`, `"battery_floor"`, `"pause_on_metered"`,
		`"require_charging"`, `"thermal_max_state"`, `"max_tasks_per_min"`, `"max_bytes_per_hour"`, `"max_memory_share"`, `"wording_sha256"`} {
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
		{"unknown thermal", func(c *Consent) { c.ThermalMaxState = "warm" }, "thermal_max_state"},
		{"negative rate", func(c *Consent) { c.MaxTasksPerMin = -1 }, "max_tasks_per_min"},
		{"rate over limit", func(c *Consent) { c.MaxTasksPerMin = MaxTasksPerMinLimit + 1 }, "max_tasks_per_min"},
		{"negative traffic cap", func(c *Consent) { c.MaxBytesPerHour = -1 }, "max_bytes_per_hour"},
		{"traffic cap over limit", func(c *Consent) { c.MaxBytesPerHour = MaxBytesPerHourLimit + 1 }, "max_bytes_per_hour"},
		{"negative memory share", func(c *Consent) { c.MaxMemoryShare = -1 }, "max_memory_share"},
		{"memory share over 100", func(c *Consent) { c.MaxMemoryShare = 101 }, "max_memory_share"},
		{"short hash", func(c *Consent) { c.WordingSHA256 = "abc" }, "wording_sha256"},
		{"upper-case hash", func(c *Consent) { c.WordingSHA256 = strings.ToUpper(DefaultWordingHash()) }, "wording_sha256"},
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
		{"bad thermal", `{"version": 1, "given_at": "2025-01-01T00:00:00Z", "thermal_max_state": "hot"}`, "thermal_max_state"},
		{"bad traffic cap", `{"version": 1, "given_at": "2025-01-01T00:00:00Z", "max_bytes_per_hour": -5}`, "max_bytes_per_hour"},
		{"bad hash", `{"version": 1, "given_at": "2025-01-01T00:00:00Z", "wording_sha256": "xyz"}`, "wording_sha256"},
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
	c.RequireCharging, c.ThermalMaxState, c.MaxTasksPerMin, c.MaxBytesPerHour = true, caps.ThermalSerious, 9, 1<<30
	c.MaxMemoryShare = 20
	want = Policy{RequireCharging: true, BatteryMinLevel: 55, ThermalMaxState: caps.ThermalSerious, MaxTasksPerMin: 9,
		PauseOnMetered: true, MaxBytesPerHour: 1 << 30, MaxMemoryShare: 20}
	if p := c.OwnerPolicy(); p != want {
		t.Fatalf("OwnerPolicy with every limit = %+v, want %+v", p, want)
	}
}

// A record written before the owner's other limits and the wording hash existed still
// loads: its limits are the loosest (the deployer's stand) and it counts as given to the
// built-in wording, and to no other.
func TestConsentOldRecord(t *testing.T) {
	dir := t.TempDir()
	old := `{"version": 1, "given_at": "2025-01-01T00:00:00Z", "run_local": true, "contribute": true,
		"cloud_fallback": false, "battery_floor": 30, "pause_on_metered": true}`
	if err := os.WriteFile(filepath.Join(dir, ConsentFile), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	c, ok, err := LoadConsent(dir)
	if err != nil || !ok {
		t.Fatalf("LoadConsent of an old record: ok %v, %v", ok, err)
	}
	if p, want := c.OwnerPolicy(), (Policy{BatteryMinLevel: 30, ThermalMaxState: caps.ThermalCritical, PauseOnMetered: true}); p != want {
		t.Fatalf("old record's OwnerPolicy = %+v, want %+v", p, want)
	}
	if c.WordingHash() != DefaultWordingHash() || !c.GivenFor(DefaultWordingHash()) {
		t.Fatalf("old record: WordingHash %q, want the built-in wording's %q", c.WordingHash(), DefaultWordingHash())
	}
	if c.GivenFor(WordingHash("the deployer's own words\n")) {
		t.Fatal("old record counts as given to a deployer's wording")
	}
}

func TestWordingHash(t *testing.T) {
	// The SHA-256 of the bytes, in lower-case hex: sha256sum agrees.
	if got, want := WordingHash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; got != want {
		t.Fatalf("WordingHash(abc) = %s, want %s", got, want)
	}
	if DefaultWordingHash() != WordingHash(ConsentWording) {
		t.Fatal("DefaultWordingHash is not the built-in wording's")
	}
	if WordingHash(ConsentWording+" ") == DefaultWordingHash() {
		t.Fatal("a changed wording hashes the same")
	}
	c := Consent{WordingSHA256: WordingHash("mine")}
	if !c.GivenFor(WordingHash("mine")) || c.GivenFor(DefaultWordingHash()) {
		t.Fatalf("GivenFor: a record given to one wording must count for it and no other")
	}
}

func TestLoadConsentWording(t *testing.T) {
	text := "Dieser Rechner hilft anderen.\nJa oder nein?\n"
	got, err := LoadConsentWording(writeFile(t, "consent.txt", text))
	if err != nil || got != text {
		t.Fatalf("LoadConsentWording = %q, %v; want the file's text as it is", got, err)
	}
	exact := strings.Repeat("x", MaxConsentWording)
	if got, err := LoadConsentWording(writeFile(t, "max.txt", exact)); err != nil || got != exact {
		t.Fatalf("a wording of exactly %d bytes: %v", MaxConsentWording, err)
	}
	for _, tt := range []struct {
		name, content string
		want          []string
	}{
		{"too large", exact + "x", []string{"64 KiB"}},
		{"empty", "", []string{"empty"}},
		{"blank", " \n\t\n", []string{"empty"}},
		{"not UTF-8", "caf\xe9\n", []string{"UTF-8"}},
		{"NUL", "a\x00b", []string{"UTF-8"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, "bad.txt", tt.content)
			got, err := LoadConsentWording(path)
			wantErr(t, err, append(tt.want, path)...)
			if got != "" {
				t.Fatalf("returned %q with its error", got)
			}
		})
	}
	path := filepath.Join(t.TempDir(), "nope.txt")
	if _, err := LoadConsentWording(path); err == nil || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Fatalf("missing file: %v, want fs.ErrNotExist naming the path", err)
	}
}

// FuzzDecodeConsent: any input either fails or yields a record that SaveConsent accepts.
func FuzzDecodeConsent(f *testing.F) {
	f.Add([]byte(`{"version":1,"given_at":"2025-01-01T00:00:00Z","contribute":true,"battery_floor":30}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`{"version":1,"given_at":"2025-01-01T00:00:00Z","thermal_max_state":"fair","max_tasks_per_min":5,"max_bytes_per_hour":1000,` +
		`"require_charging":true,"wording_sha256":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}`))
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
