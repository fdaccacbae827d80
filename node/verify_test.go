package node

import (
	"strings"
	"testing"
)

func TestConfigVerify(t *testing.T) {
	tests := []struct {
		name                string
		sample, probation   float64
		wantSample, wantPro float64
		wantErr             string
	}{
		{"defaults", 0, 0, DefaultVerifySample, DefaultVerifyProbationSample, ""},
		{"every task", 1, 0, 1, DefaultVerifyProbationSample, ""},
		{"off", VerifyOff, 0, VerifyOff, DefaultVerifyProbationSample, ""},
		{"no probation boost", 0.1, VerifyOff, 0.1, VerifyOff, ""},
		{"above one", 1.5, 0, 0, 0, "verification sample"},
		{"negative", -0.5, 0, 0, 0, "verification sample"},
		{"probation above one", 0, 2, 0, 0, "probation verification sample"},
	}
	for _, tt := range tests {
		cfg, err := Config{DataDir: t.TempDir(), VerifySample: tt.sample, VerifyProbationSample: tt.probation}.withDefaults()
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: withDefaults: %v", tt.name, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: withDefaults error %v, want one mentioning %q", tt.name, err, tt.wantErr)
		case err == nil && (cfg.VerifySample != tt.wantSample || cfg.VerifyProbationSample != tt.wantPro):
			t.Errorf("%s: samples %v and %v, want %v and %v", tt.name, cfg.VerifySample, cfg.VerifyProbationSample, tt.wantSample, tt.wantPro)
		}
	}
}
