package preload

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// The shim channel: a unix socket between the shim in a program and the
// agent, read and written with blocking system calls, over which the agent
// passes the program the descriptors of the connections it made.

// peerCred returns the uid and pid of the process at the other end of c,
// as the kernel recorded them when it connected.
func peerCred(c *net.UnixConn) (uid, pid int, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, 0, err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return -1, 0, err
	}
	if cerr != nil {
		return -1, 0, cerr
	}
	return int(cred.Uid), int(cred.Pid), nil
}

// maxTreeDepth bounds the walk up a process's ancestors.
const maxTreeDepth = 1024

// descendsFrom reports whether process pid has ancestor among its
// ancestors (or is it), by the parent links in /proc. A process whose
// parent exited has been re-parented to the nearest subreaper (vlink exec
// is one for its program) or to init.
func descendsFrom(pid, ancestor int) bool {
	for range maxTreeDepth {
		if pid == ancestor {
			return true
		}
		if pid <= 1 {
			return false
		}
		ppid, err := parentOf(pid)
		if err != nil {
			return false
		}
		pid = ppid
	}
	return false
}

// parentOf reads a process's parent from /proc/PID/stat: the field after
// the state, which follows the last ')' (the command name may hold any).
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	return strconv.Atoi(f[1])
}

// socketFamily returns 4 or 6: the address family of the socket itself.
func socketFamily(tc *net.TCPConn) uint8 {
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0
	}
	var dom int
	rc.Control(func(fd uintptr) {
		dom, _ = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_DOMAIN)
	})
	switch dom {
	case syscall.AF_INET:
		return 4
	case syscall.AF_INET6:
		return 6
	}
	return 0
}

// sendFD writes frame with tc's descriptor attached (SCM_RIGHTS).
func sendFD(c *chanConn, frame []byte, tc *net.TCPConn) error {
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	if err := rc.Control(func(fd uintptr) {
		werr = c.writeWithFD(frame, int(fd))
	}); err != nil {
		return err
	}
	return werr
}

// A chanConn is a shim channel read and written with blocking system
// calls. A shim waits for every reply; a goroutine parked in the
// netpoller takes tens of microseconds more to wake than a thread blocked
// in read(2), and a direct connect pays that on every first contact.
type chanConn struct {
	uc   *net.UnixConn // owns the original descriptor
	fd   int           // a duplicate, in blocking mode
	once sync.Once
}

func newChanConn(uc *net.UnixConn) (*chanConn, error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(orig uintptr) {
		if fd, derr = syscall.Dup(int(orig)); derr == nil {
			syscall.CloseOnExec(fd)
			derr = syscall.SetNonblock(fd, false)
		}
	}); err != nil {
		return nil, err
	}
	if derr != nil {
		if fd >= 0 {
			syscall.Close(fd)
		}
		return nil, derr
	}
	return &chanConn{uc: uc, fd: fd}, nil
}

func (c *chanConn) Read(p []byte) (int, error) {
	for {
		n, err := syscall.Read(c.fd, p)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

func (c *chanConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, err := syscall.Write(c.fd, p[done:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

func (c *chanConn) writeWithFD(frame []byte, fd int) error {
	for {
		err := syscall.Sendmsg(c.fd, frame, syscall.UnixRights(fd), nil, 0)
		if err != syscall.EINTR {
			return err
		}
	}
}

// Close ends the channel and wakes its reader; release, called by the
// reader, frees the duplicate descriptor.
func (c *chanConn) Close() error {
	c.once.Do(func() {
		syscall.Shutdown(c.fd, syscall.SHUT_RDWR)
		c.uc.Close()
	})
	return nil
}

func (c *chanConn) release() {
	c.Close()
	syscall.Close(c.fd)
}
