package reputation

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestDefaultParamsValid(t *testing.T) {
	if err := DefaultParams().Validate(); err != nil {
		t.Fatalf("DefaultParams invalid: %v", err)
	}
}

func TestValidateRejects(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	tests := []struct {
		name   string
		mutate func(*Params)
	}{
		{"NaN failure penalty", func(p *Params) { p.FailurePenalty = nan }},
		{"Inf penalty cap", func(p *Params) { p.PenaltyCap = inf }},
		{"NaN success weight", func(p *Params) { p.SuccessWeight = nan }},
		{"-Inf failure weight", func(p *Params) { p.FailureWeight = math.Inf(-1) }},
		{"NaN floor", func(p *Params) { p.AvailabilityFloor = nan }},
		{"Inf performance range", func(p *Params) { p.PerformanceRange = inf }},
		{"NaN verify failed", func(p *Params) { p.VerifyFailedWeight = nan }},
		{"NaN exploration", func(p *Params) { p.Exploration = nan }},
		{"zero cooldown base", func(p *Params) { p.CooldownBase = 0 }},
		{"negative cooldown base", func(p *Params) { p.CooldownBase = -time.Second }},
		{"cooldown max below base", func(p *Params) { p.CooldownMax = time.Second }},
		{"streak reset below cooldown max", func(p *Params) { p.StreakReset = 5 * time.Second }},
		{"negative penalty half-life", func(p *Params) { p.PenaltyHalfLife = -time.Minute }},
		{"zero availability half-life", func(p *Params) { p.AvailabilityHalfLife = 0 }},
		{"negative performance half-life", func(p *Params) { p.PerformanceHalfLife = -1 }},
		{"zero integrity half-life", func(p *Params) { p.IntegrityHalfLife = 0 }},
		{"negative retain", func(p *Params) { p.Retain = -time.Hour }},
		{"negative decay interval", func(p *Params) { p.DecayInterval = -time.Second }},
		{"decay interval not below half-life", func(p *Params) { p.DecayInterval = p.PerformanceHalfLife }},
		{"zero failure penalty", func(p *Params) { p.FailurePenalty = 0 }},
		{"penalty cap below one failure", func(p *Params) { p.PenaltyCap = 0.5 }},
		{"success factor one", func(p *Params) { p.SuccessPenaltyFactor = 1 }},
		{"success factor negative", func(p *Params) { p.SuccessPenaltyFactor = -0.1 }},
		{"negative success weight", func(p *Params) { p.SuccessWeight = -1 }},
		{"positive failure weight", func(p *Params) { p.FailureWeight = 1 }},
		{"positive heartbeat weight", func(p *Params) { p.HeartbeatMissedWeight = 1 }},
		{"positive forged weight", func(p *Params) { p.ForgedWeight = 1 }},
		{"positive malformed weight", func(p *Params) { p.MalformedWeight = 1 }},
		{"zero verify failed weight", func(p *Params) { p.VerifyFailedWeight = 0 }},
		{"verify failed too weak to exclude", func(p *Params) { p.VerifyFailedWeight = -60 }},
		{"floor below exclusion", func(p *Params) { p.AvailabilityFloor = 39 }},
		{"floor above neutral", func(p *Params) { p.AvailabilityFloor = 51 }},
		{"zero performance range", func(p *Params) { p.PerformanceRange = 0 }},
		{"huge performance range", func(p *Params) { p.PerformanceRange = 17 }},
		{"too few performance samples", func(p *Params) { p.PerformanceSamples = 0.5 }},
		{"full weight unreachable", func(p *Params) { p.SuccessCap, p.VerifyPassedCap = 5, 5 }},
		{"exploration one", func(p *Params) { p.Exploration = 1 }},
		{"negative exploration", func(p *Params) { p.Exploration = -0.01 }},
		{"zero max entries", func(p *Params) { p.MaxEntries = 0 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultParams()
			tc.mutate(&p)
			err := p.Validate()
			if !errors.Is(err, ErrInvalidParams) {
				t.Fatalf("Validate = %v, want an error wrapping ErrInvalidParams", err)
			}
			if s, err := New(p); s != nil || !errors.Is(err, ErrInvalidParams) {
				t.Fatalf("New = %v, %v; want nil and ErrInvalidParams", s, err)
			}
		})
	}
}

func TestValidateAcceptsEdgeValues(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Params)
	}{
		{"no exploration", func(p *Params) { p.Exploration = 0 }},
		{"success clears at once", func(p *Params) { p.SuccessPenaltyFactor = 0 }},
		{"floor at neutral", func(p *Params) { p.AvailabilityFloor = NeutralScore }},
		{"age on every read", func(p *Params) { p.DecayInterval = 0 }},
		{"retain nothing", func(p *Params) { p.Retain = 0 }},
		{"single entry", func(p *Params) { p.MaxEntries = 1 }},
		{"cooldown not growing", func(p *Params) { p.CooldownMax = p.CooldownBase }},
		{"malformed frames ignored", func(p *Params) { p.MalformedWeight = 0 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultParams()
			tc.mutate(&p)
			if err := p.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}
