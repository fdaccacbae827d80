package probe

import (
	"encoding/json"
	"slices"
)

// DeviceFacts are the facts about a machine that its device id (node.LoadOrCreateDevice)
// is derived from: the parts of the capability vector that stay the same while the machine
// does, read so that two reads of one machine always agree.
//
//   - CPUModel and Cores: as caps.CPU has them (/proc/cpuinfo).
//   - RAMGiB: MemTotal rounded up to a power of two GiB (a 16 GiB machine reports a little
//     under 16 GiB, by an amount that changes with the kernel; 0 when unknown).
//   - GPUs: one entry per GPU on the PCI bus, its vendor and, when sysfs names it
//     (product_name), its model, sorted. The names nvidia-smi gives are left out: the query
//     is slow, may time out, and names a GPU differently from sysfs, so a read that used it
//     would not always agree with the one before.
//
// Load, temperatures, battery and network are left out: they change while the machine runs.
// Nothing here is secret (the vector announces all of it); what keeps a device id from
// revealing it is the salt it is hashed with.
type DeviceFacts struct {
	CPUModel string   `json:"cpu_model"`
	Cores    int      `json:"cores"`
	RAMGiB   int64    `json:"ram_gib"`
	GPUs     []string `json:"gpus"`
}

// ReadDeviceFacts reads the DeviceFacts of the machine under root (DefaultRoot for this
// one) from /proc/cpuinfo, /proc/meminfo and the PCI bus, at once: it starts no Prober and
// runs no command. Missing sources leave their fields at zero, as Probe does.
func ReadDeviceFacts(root string) DeviceFacts {
	cpu := readCPU(root)
	sys, _ := scanPCI(root)
	f := DeviceFacts{CPUModel: cpu.Model, Cores: cpu.Cores, RAMGiB: roundGiB(readMemory(root).TotalMB)}
	for _, g := range sys {
		name := g.Vendor
		if g.Model != "" {
			name += " " + g.Model
		}
		f.GPUs = append(f.GPUs, name)
	}
	return f
}

// roundGiB rounds mb MiB up to a power of two GiB; 0 stays 0.
func roundGiB(mb int64) int64 {
	if mb <= 0 {
		return 0
	}
	gib := int64(1)
	for gib<<10 < mb {
		gib <<= 1
	}
	return gib
}

// Canonical is the one encoding of f that a device id hashes: JSON with the fields in a fixed
// order and the GPUs sorted, so the order the PCI bus lists them in does not matter.
func (f DeviceFacts) Canonical() []byte {
	c := f
	c.GPUs = slices.Sorted(slices.Values(f.GPUs))
	if c.GPUs == nil {
		c.GPUs = []string{} // one spelling for no GPU
	}
	b, _ := json.Marshal(c) // strings and integers: cannot fail
	return b
}
