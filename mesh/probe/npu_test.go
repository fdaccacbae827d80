package probe

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

func TestReadNPU(t *testing.T) {
	if got := readNPU(t.TempDir()); got != (caps.NPU{}) {
		t.Fatalf("readNPU on an empty tree = %+v, want none", got)
	}

	root := newTree(t, map[string]string{"dev/accel/accel0": ""})
	if got := readNPU(root); got != (caps.NPU{Present: true}) {
		t.Fatalf("readNPU with /dev/accel/accel0 = %+v, want present", got)
	}

	root = newTree(t, map[string]string{"sys/class/accel/accel0/device/vendor": "0x8086"})
	link := filepath.Join(root, "sys/class/accel/accel0/device/driver")
	if err := os.Symlink("../../../../bus/pci/drivers/intel_vpu", link); err != nil {
		t.Fatal(err)
	}
	if got, want := readNPU(root), (caps.NPU{Present: true, Vendor: "intel"}); got != want {
		t.Fatalf("readNPU = %+v, want %+v", got, want)
	}

	// An empty class directory is no device.
	root = t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "sys/class/accel"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := readNPU(root); got.Present {
		t.Fatalf("readNPU with an empty accel class = %+v, want none", got)
	}
}
