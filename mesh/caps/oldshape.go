package caps

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
)

// v1Marks holds the parts of a wire vector that only the caps/1 shape had.
type v1Marks struct {
	GPU json.RawMessage `json:"gpu"`
	CPU struct {
		ISA json.RawMessage `json:"isa"`
	} `json:"cpu"`
	NPU struct {
		Model json.RawMessage `json:"model"`
	} `json:"npu"`
	Battery struct {
		Level json.RawMessage `json:"level"`
	} `json:"battery"`
	AppState json.RawMessage `json:"app_state"`
	Net      struct {
		Effective json.RawMessage `json:"effective"`
	} `json:"net"`
}

// oldShapeMarks lists what marks data as a caps/1 vector: gpu a list, cpu.isa, npu.model,
// net.effective, app_state active or idle, or battery.level a percentage (a whole number
// above 1, at most 100). It returns nil when data has none of these (or is not a JSON object).
func oldShapeMarks(data []byte) []string {
	var m v1Marks
	// A type mismatch in one field still fills the others; a syntax error fills nothing.
	_ = json.Unmarshal(data, &m)
	var marks []string
	if g := bytes.TrimSpace(m.GPU); len(g) > 0 && g[0] == '[' {
		marks = append(marks, "gpu is a list")
	}
	if m.CPU.ISA != nil {
		marks = append(marks, "cpu.isa instead of cpu.isa_ext")
	}
	if m.NPU.Model != nil {
		marks = append(marks, "npu.model instead of npu.vendor")
	}
	if m.Net.Effective != nil {
		marks = append(marks, "net.effective instead of net.type")
	}
	var state string
	if json.Unmarshal(m.AppState, &state) == nil && (state == "active" || state == "idle") {
		marks = append(marks, fmt.Sprintf("app_state %q", state))
	}
	var level float64
	if json.Unmarshal(m.Battery.Level, &level) == nil && level > 1 && level <= 100 && level == math.Trunc(level) {
		marks = append(marks, fmt.Sprintf("battery.level %v in percent", level))
	}
	return marks
}

// oldShape returns err, which refuses data, wrapped with ErrOldShape when data has the caps/1
// shape.
func oldShape(data []byte, err error) error {
	marks := oldShapeMarks(data)
	if len(marks) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s): its sender must upgrade to caps/2: %w", ErrOldShape, strings.Join(marks, ", "), err)
}
