package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// GPU vendors as caps.GPU names them.
const (
	vendorNVIDIA = "nvidia"
	vendorAMD    = "amd"
	vendorIntel  = "intel"
	vendorOther  = "other"
)

// gpuClassPrefixes are the PCI class codes (sysfs "class", 0xCCSSPP) of GPUs: VGA-compatible
// (0x0300), 3D controller (0x0302: NVIDIA data-centre boards, hybrid-graphics dGPUs) and other
// display controller (0x0380: AMD Instinct boards list themselves there).
const gpuClassPrefixes = "0x0300 0x0302 0x0380"

// gpuWaitDelay is how long a killed nvidia-smi may keep its output pipe open before Wait gives
// up on it (a child it forked can hold the pipe). It bounds Close's wait on a hung command.
const gpuWaitDelay = 500 * time.Millisecond

// errNoCommand marks a driver tool that is not installed: not a failure, the answer is as
// fresh as it can be.
var errNoCommand = errors.New("gpu command not found")

// gpuState is what the background loop publishes for Probe. A published list is never modified
// again, so Probe copies it outside the lock.
type gpuState struct {
	list []caps.GPU
	at   time.Time // when list was produced; zero until the first PCI scan
	err  error     // the last nvidia-smi failure, nil after a success
	// refreshes counts completed refreshes (not the provisional first publication).
	refreshes int
	// changed is closed and replaced on every publication, so tests can wait without sleeping.
	changed chan struct{}
}

// loop refreshes the GPU list right away and then every gpuRefresh period. It is started by New
// through p.wg and returns when Close cancels ctx (a running nvidia-smi is killed).
func (p *Prober) loop(ctx context.Context) {
	defer p.wg.Done()
	t := time.NewTicker(p.gpuRefresh)
	defer t.Stop()
	var lastGood []caps.GPU // the last successful nvidia-smi answer; owned by this goroutine
	for {
		lastGood = p.refreshGPU(ctx, lastGood)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.refresh:
			t.Reset(p.gpuRefresh)
		}
	}
}

// refreshGPU scans PCI, queries nvidia-smi when an NVIDIA device (or no PCI bus) is visible, and
// publishes the merged list. It returns the new last good nvidia-smi answer.
func (p *Prober) refreshGPU(ctx context.Context, lastGood []caps.GPU) []caps.GPU {
	sys, pciOK := scanPCI(p.root)
	// Without a readable PCI bus (WSL, some containers) the driver tool is the only source.
	if p.gpuCommand == "" || pciOK && !hasVendor(sys, vendorNVIDIA) {
		p.publish(sys, nil, time.Now(), true)
		return lastGood
	}
	if p.firstPending() {
		p.publish(markStale(sys, vendorNVIDIA), nil, time.Now(), false)
	}
	rows, err := p.queryNVIDIA(ctx)
	if ctx.Err() != nil {
		return lastGood // closing: keep what is published
	}
	var list []caps.GPU
	switch {
	case errors.Is(err, errNoCommand):
		list, err = sys, nil
	case err != nil && lastGood != nil:
		list = mergeNVIDIA(sys, markStale(lastGood, vendorNVIDIA))
	case err != nil:
		list = markStale(sys, vendorNVIDIA)
	default:
		lastGood = rows
		list = mergeNVIDIA(sys, rows)
	}
	p.publish(list, err, time.Now(), true)
	return lastGood
}

// firstPending tells whether nothing has been published yet.
func (p *Prober) firstPending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gpu.at.IsZero()
}

// publish replaces the cached GPU list. final is false for the provisional sysfs-only list
// published while the first nvidia-smi query runs.
func (p *Prober) publish(list []caps.GPU, err error, at time.Time, final bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gpu.list, p.gpu.at, p.gpu.err = list, at, err
	if final {
		p.gpu.refreshes++
	}
	close(p.gpu.changed)
	p.gpu.changed = make(chan struct{})
}

// gpus returns a copy of the cached list, every entry marked stale when the list is older than
// twice the refresh period at now.
func (p *Prober) gpus(now time.Time) []caps.GPU {
	p.mu.Lock()
	list, at := p.gpu.list, p.gpu.at
	p.mu.Unlock()
	if len(list) == 0 {
		return nil
	}
	out := append([]caps.GPU(nil), list...)
	if now.Sub(at) > 2*p.gpuRefresh {
		for i := range out {
			out[i].Stale = true
		}
	}
	return out
}

// scanPCI lists the display and 3D controllers under root in PCI address order, at most
// caps.MaxGPUs. ok is false when the PCI device directory cannot be read.
func scanPCI(root string) (gpus []caps.GPU, ok bool) {
	dir := under(root, "/sys/bus/pci/devices")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, false
	}
	for _, e := range ents {
		if len(gpus) == caps.MaxGPUs {
			break
		}
		d := filepath.Join(dir, e.Name())
		class, _ := readString(filepath.Join(d, "class"))
		if !isGPUClass(class) {
			continue
		}
		vendor, _ := readString(filepath.Join(d, "vendor"))
		g := caps.GPU{Vendor: vendorName(vendor)}
		// amdgpu exposes dedicated memory in bytes and, on recent boards, the marketing name.
		if b, ok := readInt(filepath.Join(d, "mem_info_vram_total")); ok && b > 0 {
			g.VRAMMB = min(b>>20, caps.MaxVRAMMB)
		}
		if name, ok := readString(filepath.Join(d, "product_name")); ok {
			g.Model = cleanText(name)
		}
		gpus = append(gpus, g)
	}
	return gpus, true
}

func isGPUClass(class string) bool {
	class = strings.ToLower(class)
	for _, prefix := range strings.Fields(gpuClassPrefixes) {
		if strings.HasPrefix(class, prefix) {
			return true
		}
	}
	return false
}

// vendorName maps a PCI vendor id (sysfs "vendor", e.g. 0x10de) to a caps vendor name.
func vendorName(id string) string {
	switch strings.ToLower(id) {
	case "0x10de":
		return vendorNVIDIA
	case "0x1002":
		return vendorAMD
	case "0x8086":
		return vendorIntel
	default:
		return vendorOther
	}
}

func hasVendor(list []caps.GPU, vendor string) bool {
	for _, g := range list {
		if g.Vendor == vendor {
			return true
		}
	}
	return false
}

// markStale returns a copy of list with the entries of vendor marked stale.
func markStale(list []caps.GPU, vendor string) []caps.GPU {
	out := append([]caps.GPU(nil), list...)
	for i := range out {
		if out[i].Vendor == vendor {
			out[i].Stale = true
		}
	}
	return out
}

// mergeNVIDIA replaces the NVIDIA entries of the sysfs list, in order, with the nvidia-smi rows
// (which enumerate by PCI address too). Rows beyond the sysfs entries are appended (no readable
// PCI bus); sysfs entries beyond the rows (a device the driver does not drive) stay as they are.
func mergeNVIDIA(sys, rows []caps.GPU) []caps.GPU {
	out := make([]caps.GPU, 0, max(len(sys), len(rows)))
	next := 0
	for _, g := range sys {
		if g.Vendor == vendorNVIDIA && next < len(rows) {
			g = rows[next]
			next++
		}
		out = append(out, g)
	}
	out = append(out, rows[next:]...)
	return out[:min(len(out), caps.MaxGPUs)]
}

// queryNVIDIA runs the configured nvidia-smi with p.gpuTimeout and parses its answer.
func (p *Prober) queryNVIDIA(ctx context.Context) ([]caps.GPU, error) {
	path, err := exec.LookPath(p.gpuCommand)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w: %w", p.gpuCommand, errNoCommand, err)
	}
	ctx, cancel := context.WithTimeout(ctx, p.gpuTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits")
	out := &cappedBuffer{max: maxFileBytes}
	cmd.Stdout = out
	cmd.WaitDelay = gpuWaitDelay
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err() // the kill's "signal: killed" hides why
		}
		return nil, fmt.Errorf("run %s: %w", p.gpuCommand, err)
	}
	return parseNVIDIASMI(out.Bytes()), nil
}

// parseNVIDIASMI parses "name, memory.total" CSV rows (no header, memory in MiB). A row whose
// memory is not a number ("[N/A]") keeps VRAMMB 0; lines without a comma are skipped. At most
// caps.MaxGPUs rows are returned.
func parseNVIDIASMI(out []byte) []caps.GPU {
	var gpus []caps.GPU
	for line := range bytes.Lines(out) {
		if len(gpus) == caps.MaxGPUs {
			break
		}
		// The name comes first and may itself hold a comma; memory is the last field.
		i := bytes.LastIndexByte(line, ',')
		if i < 0 {
			continue
		}
		g := caps.GPU{Vendor: vendorNVIDIA, Model: cleanText(string(line[:i]))}
		if mb, err := strconv.ParseInt(string(bytes.TrimSpace(line[i+1:])), 10, 64); err == nil && mb > 0 {
			g.VRAMMB = min(mb, caps.MaxVRAMMB)
		}
		gpus = append(gpus, g)
	}
	return gpus
}

// cappedBuffer keeps the first max bytes written and discards the rest without failing the
// writer, so a chatty command is neither unbounded in memory nor killed by EPIPE.
type cappedBuffer struct {
	buf bytes.Buffer
	max int
}

func (c *cappedBuffer) Write(b []byte) (int, error) {
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(b[:min(len(b), room)])
	}
	return len(b), nil
}

func (c *cappedBuffer) Bytes() []byte { return c.buf.Bytes() }
