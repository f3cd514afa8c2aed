package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// netnsDir is where "ip netns add" mounts named namespaces.
const netnsDir = "/run/netns"

// inNetns runs f on the calling goroutine's OS thread, moved into the
// namespace nsfd for the duration. If the thread cannot be moved back,
// it stays locked, and the runtime ends it when the goroutine returns:
// no other goroutine ever runs in the wrong namespace.
func inNetns(nsfd int, f func() error) error {
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("lab: opening this thread's network namespace: %w", err)
	}
	defer unix.Close(orig)
	if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("lab: entering network namespace: %w", err)
	}
	defer func() {
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return f()
}

// runCmd runs a command (ip, tc, nft) and returns its error with its
// output, which is where those programs say what went wrong.
func runCmd(ctx context.Context, stdin string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if msg == "" {
			return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
		}
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return nil
}

// writeSysctl sets key (dotted) in the namespace the calling thread is in.
func writeSysctl(key, value string) error {
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	if err := os.WriteFile(path, []byte(value), 0); err != nil {
		return fmt.Errorf("sysctl %s=%q: %w", key, value, err)
	}
	return nil
}

func readSysctl(key string) (string, error) {
	b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(key, ".", "/"))
	return strings.TrimSpace(string(b)), err
}

const ccKey = "net.ipv4.tcp_congestion_control"

// allowCongestionControl adds cc to net.ipv4.tcp_allowed_congestion_control
// of the namespace this process started in (the machine's, normally):
// outside the initial namespace, Linux refuses a default that is not in
// that list (EPERM). The change is global but only additive: it changes
// no default, only what unprivileged programs may choose.
func allowCongestionControl(cc string) error {
	const allowedKey = "net.ipv4.tcp_allowed_congestion_control"
	// /proc/self is the main thread's, which Do never moves.
	root, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	return inNetns(root, func() error {
		cur, err := readSysctl(allowedKey)
		if err != nil {
			return err
		}
		for _, a := range strings.Fields(cur) {
			if a == cc {
				return nil
			}
		}
		return writeSysctl(allowedKey, cur+" "+cc)
	})
}

// openTUN creates TUN device name in namespace nsfd, with virtio-net
// headers and TCP segmentation offload (see gso.go), and returns it
// non-blocking, so that reads wait in the runtime's poller and Close
// interrupts them.
func openTUN(nsfd int, name string) (*os.File, error) {
	var f *os.File
	err := inNetns(nsfd, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("opening /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("TUNSETIFF %s: %w", name, err)
		}
		hdr := vnetHdrLen
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETVNETHDRSZ, uintptr(unsafe.Pointer(&hdr))); e != 0 {
			unix.Close(fd)
			return fmt.Errorf("TUNSETVNETHDRSZ %s: %w", name, e)
		}
		// TSO only: UDP is not segmented by the kernel for us, so loss
		// applies per datagram without splitting anything.
		if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, unix.TUN_F_CSUM|unix.TUN_F_TSO4|unix.TUN_F_TSO6); err != nil {
			unix.Close(fd)
			return fmt.Errorf("TUNSETOFFLOAD %s: %w", name, err)
		}
		f = os.NewFile(uintptr(fd), name)
		return nil
	})
	return f, err
}

// procStart returns the start time of process pid (clock ticks since
// boot, field 22 of /proc/PID/stat), which tells a live owner from a
// later process that reused its PID, and whether it is a zombie (dead,
// not yet reaped: a SIGKILLed owner whose parent has not waited).
func procStart(pid int) (start uint64, zombie bool, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false, err
	}
	// The command name (field 2) may hold spaces and parentheses; the
	// fields after it start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, false, errors.New("malformed stat")
	}
	_, err = fmt.Sscan(f[19], &start)
	return start, f[0] == "Z" || f[0] == "X", err
}

// alive reports whether process pid runs and is the one that started at
// start (0: any).
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	s, zombie, err := procStart(pid)
	if err != nil || zombie {
		return false
	}
	return start == 0 || s == start
}

// netnsPids returns the processes in the named namespace, as "ip netns
// pids" does: every process whose /proc/PID/ns/net is that namespace.
func netnsPids(name string) []int {
	var st unix.Stat_t
	if unix.Stat(netnsDir+"/"+name, &st) != nil {
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid <= 0 {
			continue
		}
		var ps unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &ps) != nil {
			continue
		}
		if ps.Dev == st.Dev && ps.Ino == st.Ino {
			pids = append(pids, pid)
		}
	}
	return pids
}

// deleteNetns kills the processes left in the named namespace and
// removes it. The namespace itself goes when its last user does; its
// devices go with it.
func deleteNetns(name string) error {
	self := os.Getpid()
	for range 3 {
		pids := netnsPids(name)
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			if p != self {
				syscall.Kill(p, syscall.SIGKILL)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	err := runCmd(context.Background(), "", "ip", "netns", "delete", name)
	if err != nil {
		if _, serr := os.Stat(netnsDir + "/" + name); errors.Is(serr, os.ErrNotExist) {
			return nil // someone else removed it first
		}
	}
	return err
}
