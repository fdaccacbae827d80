package probe

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// Defaults.
const (
	// DefaultRoot is the file system root every source is read under.
	DefaultRoot = "/"
	// DefaultGPURefresh is the GPU refresh period. GPUs are not hot-plugged in practice; a
	// minute keeps a slow nvidia-smi (seconds without persistence mode) a small duty cycle.
	DefaultGPURefresh = 60 * time.Second
	// DefaultGPUCommand is the NVIDIA query tool, looked up on PATH at every refresh.
	DefaultGPUCommand = "nvidia-smi"
	// DefaultGPUTimeout bounds one nvidia-smi run. A warm driver answers in tens of
	// milliseconds; a cold one in 2 s with persistence mode and up to 30 s without (Azure
	// aks-gpu #105). Beyond 5 s the cached answer, marked stale, is worth more than waiting.
	DefaultGPUTimeout = 5 * time.Second
)

// Hardware is the hardware part of a capability vector, as one Probe saw it.
type Hardware struct {
	CPU     caps.CPU
	GPU     []caps.GPU
	NPU     caps.NPU
	RAM     caps.RAM
	Battery caps.Battery
	Thermal string // one of caps.ThermalNominal, ThermalFair, ThermalSerious, ThermalCritical
	// NetType is the kind of link the default route leaves through, one of the caps.Net*
	// types (see readNetType).
	NetType string
	// Metered is true when that link is cellular.
	Metered bool
	// SensorsOK is false when procfs or sysfs cannot be read at all: then nothing above is
	// known, and callers that enforce limits must assume the worst.
	SensorsOK bool
}

// Prober reads the hardware. Create it with New and stop it with Close.
type Prober struct {
	root       string
	gpuRefresh time.Duration
	gpuCommand string
	gpuTimeout time.Duration

	cpuOnce sync.Once
	cpu     caps.CPU // read once by cpuOnce, never modified after

	cancel    context.CancelFunc
	refresh   chan struct{} // Refresh's one-slot nudge to the GPU loop
	wg        sync.WaitGroup
	closeOnce sync.Once

	mu  sync.Mutex
	gpu gpuState
}

// Option configures a Prober.
type Option func(*config) error

type config struct {
	root       string
	gpuRefresh time.Duration
	gpuCommand string
	gpuTimeout time.Duration
}

// WithRoot reads every source under dir instead of DefaultRoot, e.g. dir/proc/meminfo.
func WithRoot(dir string) Option {
	return func(c *config) error {
		if dir == "" {
			return errors.New("root is empty")
		}
		c.root = dir
		return nil
	}
}

// WithGPURefresh sets the GPU refresh period (DefaultGPURefresh). GPU data older than twice the
// period is marked stale.
func WithGPURefresh(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("gpu refresh period %v not positive", d)
		}
		c.gpuRefresh = d
		return nil
	}
}

// WithGPUCommand sets the NVIDIA query tool (DefaultGPUCommand), a name looked up on PATH or a
// path. Empty disables running it: NVIDIA GPUs are then described from sysfs alone.
func WithGPUCommand(name string) Option {
	return func(c *config) error {
		c.gpuCommand = name
		return nil
	}
}

// WithGPUTimeout bounds one run of the GPU command (DefaultGPUTimeout).
func WithGPUTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("gpu timeout %v not positive", d)
		}
		c.gpuTimeout = d
		return nil
	}
}

// New returns a Prober and starts its background GPU refresh, whose first run begins at once;
// New itself does no I/O.
func New(opts ...Option) (*Prober, error) {
	cfg := config{
		root:       DefaultRoot,
		gpuRefresh: DefaultGPURefresh,
		gpuCommand: DefaultGPUCommand,
		gpuTimeout: DefaultGPUTimeout,
	}
	for _, opt := range opts {
		if err := opt(&cfg); err != nil {
			return nil, fmt.Errorf("probe option: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Prober{
		root:       cfg.root,
		gpuRefresh: cfg.gpuRefresh,
		gpuCommand: cfg.gpuCommand,
		gpuTimeout: cfg.gpuTimeout,
		cancel:     cancel,
		gpu:        gpuState{changed: make(chan struct{})},
		refresh:    make(chan struct{}, 1),
	}
	p.wg.Add(1)
	go p.loop(ctx) // returns when Close cancels ctx
	return p, nil
}

// Probe reads the current hardware state. It never runs a command: GPU data comes from the
// background cache, marked stale when older than twice the refresh period at now (pass
// time.Now()). The first call also reads the static CPU description. Probe keeps working after
// Close, with GPU data that ages into staleness.
func (p *Prober) Probe(now time.Time) Hardware {
	p.cpuOnce.Do(func() { p.cpu = readCPU(p.root) })
	cpu := p.cpu
	cpu.ISAExt = append([]string(nil), p.cpu.ISAExt...)
	netType := readNetType(p.root)
	return Hardware{
		CPU:       cpu,
		GPU:       p.gpus(now),
		NPU:       readNPU(p.root),
		RAM:       readMemory(p.root),
		Battery:   readBattery(p.root),
		Thermal:   readThermal(p.root),
		NetType:   netType,
		Metered:   netType == caps.NetCellular,
		SensorsOK: sensorsAnswer(p.root),
	}
}

// Vector returns the hardware part of a desktop node's capability vector: runtime desktop,
// app_state foreground, cpu, gpu (the GPU with the most VRAM, the first of those on a tie)
// with every GPU in gpus, npu, ram, battery (floor 0: the participation policy's to say),
// thermal, and net's type and metered flag. The caller fills the rest.
func (h Hardware) Vector() caps.Vector {
	v := caps.Vector{
		Runtime:  caps.RuntimeDesktop,
		CPU:      h.CPU,
		GPUs:     h.GPU,
		NPU:      h.NPU,
		RAM:      h.RAM,
		Battery:  h.Battery,
		Thermal:  h.Thermal,
		AppState: caps.AppStateForeground,
		Net:      caps.Net{Type: h.NetType, Metered: h.Metered},
	}
	best := -1
	for i, g := range h.GPU {
		if best < 0 || g.VRAMMB > h.GPU[best].VRAMMB {
			best = i
		}
	}
	if best >= 0 {
		g := h.GPU[best] // a copy: gpu never aliases an entry of gpus
		v.GPU = &g
	}
	return v
}

// Refresh asks the background loop to re-probe the GPUs now instead of at its next period
// (the router calls it when a route degrades: the hardware may have changed). Calls while a
// refresh is pending fold into it; it never blocks.
func (p *Prober) Refresh() {
	select {
	case p.refresh <- struct{}{}:
	default:
	}
}

// Close stops the background GPU refresh, killing a running GPU command, and waits for it to
// exit. It is idempotent and always returns nil.
func (p *Prober) Close() error {
	p.closeOnce.Do(func() {
		p.cancel()
		p.wg.Wait()
	})
	return nil
}
