// Package probe reads the hardware part of a node's capability vector (caps.CPU, caps.GPU,
// caps.NPU, caps.RAM, caps.Battery, the thermal state and the kind of network link) from Linux
// procfs and sysfs. Hardware.Vector lays it out as a desktop node's caps/2 vector.
//
// # Sources
//
// Every path is read under a root directory (WithRoot, default "/"), so tests lay out a fake
// tree and the real one is never special-cased:
//
//   - CPU: /proc/cpuinfo. Cores is the number of "processor" lines (runtime.NumCPU when the file
//     is absent or lists none), Arch is runtime.GOARCH, Model comes from "model name" (x86), else
//     "Model" or "Hardware" (ARM), ISAExt is the first "flags" (x86) or "Features" (ARM) line
//     filtered to the notable extensions of notableISA, in that list's order.
//   - RAM: /proc/meminfo MemTotal and MemAvailable (MemFree on kernels without MemAvailable).
//   - Battery: /sys/class/power_supply/*: type, scope, present, capacity (or energy_* /
//     charge_*), status, online. The level is announced as a fraction (0-1).
//   - Thermal: /sys/class/thermal/thermal_zone*: temp and the "hot" and "critical" trip points.
//   - GPU: /sys/bus/pci/devices/*: class, vendor, and the amdgpu attributes mem_info_vram_total
//     and product_name; for NVIDIA devices the output of
//     "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits".
//   - NPU: any entry in /sys/class/accel or /dev/accel (the kernel's compute accelerator class);
//     the vendor from the driver of the first one.
//   - Network: the interface of the default route in /proc/net/route, classified by its
//     /sys/class/net/<dev> uevent DEVTYPE, wireless directory, type and name (cellular, wifi,
//     bluetooth, ethernet, other; unknown without a default route). Cellular is metered.
//
// # Invariants
//
// Probe is the hot path: it reads a handful of small procfs and sysfs files and the cached GPU
// list, and never runs a command, so its cost is tens to hundreds of microseconds (B5 budget
// 40 ms, goal warm p99 ≤ 5 ms). The static CPU part is read once, on the first Probe.
//
// GPU data is produced by one background goroutine, started by New and stopped by Close, which
// refreshes it right away and then every WithGPURefresh period. The PCI scan is cheap; the
// nvidia-smi query runs with a timeout (WithGPUTimeout) because on a host without persistence
// mode a single call takes seconds. A GPU entry is marked Stale when the cached list is older
// than twice the refresh period at Probe's now, or when the query that should have described it
// failed or timed out (then the last good answer is kept, marked stale). Until the first PCI scan
// has finished Probe returns no GPU; between that scan and the end of the first nvidia-smi query
// it returns the sysfs-only list with NVIDIA entries marked stale.
//
// Every file read is bounded (maxFileBytes, maxCPUInfoBytes). A missing or unreadable file is
// not an error: the field keeps its documented default (0, false, "", nominal). Garbage content
// never panics; values are clamped into the bounds of package caps and text is cleaned so that
// a vector built from a Hardware passes caps.Vector.Validate.
//
// A Prober is safe for concurrent use.
//
// # Imports
//
// Only mesh/caps from this project, and the standard library. No network, no logging.
package probe
