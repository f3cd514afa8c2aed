// Package sdnotify tells systemd how a service it started with
// Type=notify (or notify-reload) is doing, the protocol of sd_notify(3):
// one datagram of newline-separated VAR=VALUE assignments, sent to the
// socket systemd names in $NOTIFY_SOCKET. Outside systemd it does
// nothing, so a program calls it unconditionally.
package sdnotify

import (
	"fmt"
	"net"
	"os"
	"strings"
)

// EnvSocket names the socket systemd listens on.
const EnvSocket = "NOTIFY_SOCKET"

// States a service sends.
const (
	// Ready: start-up, or a reload, is complete.
	Ready = "READY=1"
	// Stopping: the service is shutting down (draining).
	Stopping = "STOPPING=1"
)

// Reloading is the state that opens a reload, with the time it began
// (CLOCK_MONOTONIC), which Type=notify-reload requires; Ready closes it.
func Reloading() string {
	return fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d", monotonicUsec())
}

// Status is a line systemctl status shows.
func Status(line string) string {
	return "STATUS=" + strings.NewReplacer("\n", " ", "\r", " ").Replace(line)
}

// Notify sends states to systemd in one datagram. Without $NOTIFY_SOCKET
// it does nothing and returns nil.
func Notify(states ...string) error {
	path := os.Getenv(EnvSocket)
	if path == "" || len(states) == 0 {
		return nil
	}
	// An abstract socket is written @name; Go's net package maps the @ to
	// the leading NUL the kernel wants.
	if path[0] != '/' && path[0] != '@' {
		return fmt.Errorf("sdnotify: %s=%q: only unix sockets (a path, or @name) are supported", EnvSocket, path)
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sdnotify: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(strings.Join(states, "\n") + "\n")); err != nil {
		return fmt.Errorf("sdnotify: %w", err)
	}
	return nil
}
