package preload

import (
	"testing"
	"time"
)

func TestSynTimeout(t *testing.T) {
	for _, tc := range []struct {
		retries int
		want    time.Duration
	}{
		{1, 3 * time.Second},
		{3, 15 * time.Second},
		{6, 127 * time.Second},               // the kernel's default, as tcp(7) says
		{8, (127 + 120 + 120) * time.Second}, // the last two waits capped at TCP_RTO_MAX
	} {
		if got := synTimeout(tc.retries); got != tc.want {
			t.Errorf("synTimeout(%d) = %v, want %v", tc.retries, got, tc.want)
		}
	}
	if got := KernelConnectTimeout(); got < 3*time.Second {
		t.Errorf("KernelConnectTimeout() = %v, want at least a retry's 3 s", got)
	}
}
