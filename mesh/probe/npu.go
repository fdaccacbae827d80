package probe

import (
	"os"
	"path/filepath"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// npuVendor names the vendor behind a driver of the kernel's accel class.
func npuVendor(driver string) string {
	switch driver {
	case "intel_vpu", "habanalabs": // Intel NPU (Meteor Lake and later), Habana Gaudi
		return vendorIntel
	case "amdxdna": // AMD XDNA (Ryzen AI)
		return vendorAMD
	case "qaic": // Qualcomm Cloud AI
		return "qualcomm"
	case "rocket": // Rockchip NPU
		return "rockchip"
	default:
		return vendorOther
	}
}

// readNPU reports a neural accelerator when the kernel's compute accelerator class (accel, Linux
// 6.2+: Intel NPU, AMD XDNA, Habana) has a device under root, in /sys/class/accel or /dev/accel.
// Vendor comes from the driver of the first sysfs device (intel_vpu: intel, amdxdna: amd, ...;
// another driver: other), and is empty when no driver can be read. Accelerators outside that
// class (vendor character devices) are not seen.
func readNPU(root string) caps.NPU {
	dir := under(root, "/sys/class/accel")
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		npu := caps.NPU{Present: true}
		if link, err := os.Readlink(filepath.Join(dir, ents[0].Name(), "device", "driver")); err == nil {
			npu.Vendor = npuVendor(filepath.Base(link))
		}
		return npu
	}
	if ents, err := os.ReadDir(under(root, "/dev/accel")); err == nil && len(ents) > 0 {
		return caps.NPU{Present: true}
	}
	return caps.NPU{}
}
