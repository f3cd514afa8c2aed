package metrics

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetricsStackLabelBounded(t *testing.T) {
	m := newMetrics()
	for i := range maxStackLabels + 5 {
		m.RelayStarted(fmt.Sprintf("s%d", i))
	}
	m.RelayStarted("s0")
	if got := testutil.ToFloat64(m.open.WithLabelValues("other")); got != 5 {
		t.Errorf("stacks past the first %d: %v connections labelled other, want 5", maxStackLabels, got)
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("s0")); got != 2 {
		t.Errorf("a stack seen before keeps its label: %v connections labelled s0, want 2", got)
	}
}
