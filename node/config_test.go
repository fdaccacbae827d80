package node

import (
	"strings"
	"testing"
)

func TestConfigBackend(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // "" for a valid config
	}{
		{"synth by default", Config{Models: []string{"synth-tiny"}}, ""},
		{"synth serving nothing", Config{}, ""},
		{"openai", Config{Backend: BackendOpenAI, Upstream: "http://127.0.0.1:8080", Models: []string{"qwen"}}, ""},
		{"openai without upstream", Config{Backend: BackendOpenAI, Models: []string{"qwen"}}, "--upstream"},
		{"openai without models", Config{Backend: BackendOpenAI, Upstream: "http://127.0.0.1:8080"}, "--model"},
		{"upstream without openai", Config{Upstream: "http://127.0.0.1:8080"}, "--backend openai"},
		{"unknown backend", Config{Backend: "llamacpp"}, "known backends"},
	}
	for _, tt := range tests {
		tt.cfg.DataDir = t.TempDir()
		cfg, err := tt.cfg.withDefaults()
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: withDefaults: %v", tt.name, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: withDefaults error %v, want one mentioning %q", tt.name, err, tt.wantErr)
		case err == nil && (cfg.Backend == "" || cfg.UpstreamKeyEnv != DefaultUpstreamKeyEnv):
			t.Errorf("%s: backend %q key env %q, want the defaults filled in", tt.name, cfg.Backend, cfg.UpstreamKeyEnv)
		}
	}
}
