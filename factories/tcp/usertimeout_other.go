//go:build !linux

package tcp

import (
	"syscall"
	"time"
)

// setUserTimeout: TCP_USER_TIMEOUT is Linux's; elsewhere a side with
// data in flight on a dead path waits for the kernel's retries.
func setUserTimeout(syscall.RawConn, time.Duration) error { return nil }
