package jobmanager

import (
	"math"
	"testing"
)

// A vertex's watermark is the least input watermark of its subtasks, and
// none while a subtask has not reported one or is before its first.
func TestVertexWatermarkIsTheLeastOfItsSubtasks(t *testing.T) {
	for _, tc := range []struct {
		name     string
		subtasks []subtaskInfo
		want     int64 // -1: none
	}{
		{"no subtasks", nil, -1},
		{"least of all", []subtaskInfo{{inputWatermark: 5000, known: true}, {inputWatermark: 3000, known: true}}, 3000},
		{"a subtask not reported", []subtaskInfo{{inputWatermark: 5000, known: true}, {}}, -1},
		{"a subtask before its first", []subtaskInfo{{inputWatermark: 5000, known: true}, {inputWatermark: math.MinInt64, known: true}}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := vertexWatermark(tc.subtasks)
			switch {
			case tc.want == -1 && got != nil:
				t.Fatalf("watermark %d, want none", *got)
			case tc.want != -1 && (got == nil || *got != tc.want):
				t.Fatalf("watermark %v, want %d", got, tc.want)
			}
		})
	}
}
