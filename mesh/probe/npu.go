package probe

import (
	"os"
	"path/filepath"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// readNPU reports a neural accelerator when the kernel's compute accelerator class (accel, Linux
// 6.2+: Intel NPU, AMD XDNA, Habana) has a device under root, in /sys/class/accel or /dev/accel.
// Model is the driver name of the first sysfs device (intel_vpu, amdxdna, ...) when it can be
// read, else empty. Accelerators outside that class (vendor character devices) are not seen.
func readNPU(root string) caps.NPU {
	dir := under(root, "/sys/class/accel")
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		npu := caps.NPU{Present: true}
		if link, err := os.Readlink(filepath.Join(dir, ents[0].Name(), "device", "driver")); err == nil {
			npu.Model = cleanText(filepath.Base(link))
		}
		return npu
	}
	if ents, err := os.ReadDir(under(root, "/dev/accel")); err == nil && len(ents) > 0 {
		return caps.NPU{Present: true}
	}
	return caps.NPU{}
}
