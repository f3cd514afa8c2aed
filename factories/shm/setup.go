//go:build linux

package shm

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// samePeer checks that the process at the other end of c runs as this
// one's user: the socket's folder keeps others out, and this says so
// again where the descriptors change hands. It returns the peer's pid.
func samePeer(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	if int(cred.Uid) != os.Getuid() {
		return 0, fmt.Errorf("shm: the peer (pid %d) runs as user %d, not %d", cred.Pid, cred.Uid, os.Getuid())
	}
	return int(cred.Pid), nil
}

// pidAddr is the address of a connection's process end: its pid.
func pidAddr(pid int) Addr { return Addr{"pid:" + strconv.Itoa(pid)} }

// dialSetup is the dialer's side of the set-up on c: it makes the
// memory and the bells, passes them, and waits for the listener's word.
func dialSetup(c *net.UnixConn, size int, raddr Addr) (_ *conn, err error) {
	if _, err := samePeer(c); err != nil {
		return nil, err
	}
	laddr := pidAddr(os.Getpid())
	total := mappingSize(size)
	memfd, err := unix.MemfdCreate("vlink-shm", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("shm: memfd_create: %w", err)
	}
	defer unix.Close(memfd) // the mapping stays
	if err := unix.Ftruncate(memfd, int64(total)); err != nil {
		return nil, fmt.Errorf("shm: sizing the memory: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(memfd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return nil, fmt.Errorf("shm: sealing the memory: %w", err)
	}
	var efds [4]int // data and room bells of ring 0, then of ring 1
	for i := range efds {
		if efds[i], err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
			closeFds(efds[:i])
			return nil, fmt.Errorf("shm: eventfd: %w", err)
		}
	}
	mem, err := unix.Mmap(memfd, 0, total, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		closeFds(efds[:])
		return nil, fmt.Errorf("shm: mmap: %w", err)
	}
	fail := func(err error) (*conn, error) {
		unix.Munmap(mem)
		closeFds(efds[:])
		return nil, err
	}
	if _, _, err := c.WriteMsgUnix(encodeHello(size), unix.UnixRights(memfd, efds[0], efds[1], efds[2], efds[3]), nil); err != nil {
		return fail(err)
	}
	var reply [1]byte
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		return fail(fmt.Errorf("shm: waiting for the listener's answer: %w", err))
	}
	if reply[0] != 0 {
		return fail(fmt.Errorf("%w: the listener refused the set-up (%d)", errProtocol, reply[0]))
	}
	b, err := makeBells(efds, 0)
	if err != nil {
		return fail(err)
	}
	c.SetDeadline(time.Time{})
	return newConn(mem, size, b, c, 0, laddr, raddr), nil
}

// acceptSetup is the listener's side: it takes the dialer's hello and
// descriptors, checks them, maps the memory and says yes. Anything
// wrong closes what was received and fails this connection only.
func acceptSetup(c *net.UnixConn, laddr Addr) (*conn, error) {
	pid, err := samePeer(c)
	if err != nil {
		return nil, err
	}
	raddr := pidAddr(pid)
	buf := make([]byte, helloSize+1)
	oob := make([]byte, unix.CmsgSpace(4*numFds))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	fds, perr := receivedFds(oob[:oobn])
	refuse := func(err error) (*conn, error) {
		closeFds(fds)
		c.Write([]byte{1})
		return nil, err
	}
	switch {
	case err != nil:
		return refuse(err)
	case perr != nil:
		return refuse(perr)
	case flags&unix.MSG_CTRUNC != 0 || len(fds) != numFds:
		return refuse(fmt.Errorf("%w: %d descriptors, want %d", errProtocol, len(fds), numFds))
	}
	size, err := decodeHello(buf[:n])
	if err != nil {
		return refuse(err)
	}
	total := mappingSize(size)
	if err := checkMemory(fds[0], total); err != nil {
		return refuse(err)
	}
	for _, fd := range fds[1:] {
		if err := checkEventfd(fd); err != nil {
			return refuse(err)
		}
	}
	mem, err := unix.Mmap(fds[0], 0, total, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return refuse(fmt.Errorf("shm: mmap: %w", err))
	}
	unix.Close(fds[0])
	efds := [4]int(fds[1:])
	fds = fds[1:]
	b, err := makeBells(efds, 1)
	if err != nil {
		unix.Munmap(mem)
		return refuse(err)
	}
	if _, err := c.Write([]byte{0}); err != nil {
		b.waitData.Close()
		b.waitRoom.Close()
		unix.Close(b.ringData)
		unix.Close(b.ringRoom)
		unix.Munmap(mem)
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return newConn(mem, size, b, c, 1, laddr, raddr), nil
}

// makeBells sorts the four bells (data and room of ring 0, of ring 1)
// for side: it consumes ring 1-side and produces into ring side.
func makeBells(efds [4]int, side int) (bells, error) {
	in, out := 1-side, side
	for _, fd := range efds {
		if err := unix.SetNonblock(fd, true); err != nil {
			return bells{}, err
		}
	}
	return bells{
		waitData: os.NewFile(uintptr(efds[2*in]), "shm-data-bell"),
		waitRoom: os.NewFile(uintptr(efds[2*out+1]), "shm-room-bell"),
		ringData: efds[2*out],
		ringRoom: efds[2*in+1],
	}, nil
}

// receivedFds returns the descriptors the control messages passed.
func receivedFds(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			return fds, err
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// checkMemory checks the dialer's memory: a memfd of the size the
// hello implies, sealed so that it cannot shrink (a peer that shrank it
// under this side would make its reads fault).
func checkMemory(fd, total int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(total) {
		return fmt.Errorf("%w: the memory is %d bytes, want %d", errProtocol, st.Size, total)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("%w: the memory is not a memfd: %w", errProtocol, err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return fmt.Errorf("%w: the memory's size is not sealed", errProtocol)
	}
	return nil
}

// checkEventfd checks that fd is an eventfd.
func checkEventfd(fd int) error {
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return err
	}
	if link != "anon_inode:[eventfd]" {
		return fmt.Errorf("%w: a bell is %s, not an eventfd", errProtocol, link)
	}
	return nil
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
