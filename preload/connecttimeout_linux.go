package preload

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// synRetriesFile holds how many times the kernel sends a connect's SYN
// again before it gives up.
const synRetriesFile = "/proc/sys/net/ipv4/tcp_syn_retries"

// KernelConnectTimeout is how long this machine's kernel lets a connect
// wait for a host that does not answer before it fails with ETIMEDOUT:
// the SYN, then net.ipv4.tcp_syn_retries more (6 unless set: 127 s in
// all), each after twice the last wait, from 1 s up to 120 s.
func KernelConnectTimeout() time.Duration {
	retries := 6
	if b, err := os.ReadFile(synRetriesFile); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			retries = n
		}
	}
	return synTimeout(retries)
}

// synTimeout is how long a SYN sent again retries times waits in all.
func synTimeout(retries int) time.Duration {
	const first, most = time.Second, 120 * time.Second // TCP_TIMEOUT_INIT, TCP_RTO_MAX
	var total time.Duration
	for rto, i := first, 0; i <= retries; i++ {
		total += rto
		rto = min(2*rto, most)
	}
	return total
}
