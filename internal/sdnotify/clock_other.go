//go:build !linux

package sdnotify

// monotonicUsec: systemd runs on Linux only.
func monotonicUsec() int64 { return 0 }
