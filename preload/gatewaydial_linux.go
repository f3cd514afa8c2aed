package preload

import (
	"context"
	"encoding/binary"
	"io"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/factories/tcp"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// A blocking connect whose rule is the tcp factory alone through a
// gateway given as an address, with no key to prove and no identity to
// check, is plain TCP to the gateway after one hello and its answer: the
// agent makes that connection on the channel's thread too (dialPlain),
// sends the hello and waits for the answer in poll(2), and passes the
// program the socket, as the stacks' dialer would after the same
// exchange. A gateway that takes such hellos on its event loop answers
// within tens of microseconds (vlink serve unkeyed), a wait that poll(2)
// pays for where the netpoller's hand-offs do not (BENCHMARKS §3, "The
// gateway's event loop": 0.80x the excess of the stacks' dialer).

// gatewayFactory returns the tcp factory of d's stack and the gateway's
// address when the agent can make d's connect itself: tcp alone, with
// options PrepareSocket carries out, through a gateway that is an
// address of the program socket's family fam (4 or 6), and a
// configuration with no key, node or certificate. (Pinned identities are
// checked by an encryption layer, which tcp alone has none of.) Else
// nil: the stacks dial.
func (a *Agent) gatewayFactory(d decision, fam uint8) (*tcp.Factory, netip.AddrPort) {
	cfg := a.router.cfg
	if d.rule.Action != selector.Stack || d.rule.Via == "" || len(d.stack.Layers) != 1 ||
		cfg.Key != nil || cfg.Node != "" || a.stacks.Member != nil {
		return nil, netip.AddrPort{}
	}
	gw, err := netip.ParseAddrPort(d.rule.Via)
	if err != nil || gw.Addr().Zone() != "" || gw.Addr().Is4() != (fam == 4) {
		return nil, netip.AddrPort{}
	}
	l := d.stack.Layers[0]
	return tcp.PreparedLayer(l.Name, l.Params, gw.Addr()), gw
}

// dialGateway connects a socket with f's options to the gateway gw, asks
// it for target with the hello a Dialer would send, and returns the
// socket once the gateway accepted, all within timeout; a refusal comes
// back as the *vlink.RefusedError it carries. With rec, it writes there
// how to make the same connection again (recipe.go).
func dialGateway(ctx context.Context, f *tcp.Factory, gw netip.AddrPort, target string, timeout time.Duration, rec *recipe) (int, error) {
	deadline := time.Now().Add(timeout)
	fd, err := dialPlain(ctx, f, gw, timeout)
	if err != nil {
		return -1, err
	}
	// The hello's wait is the program's connect timeout, as the stacks'
	// dialer takes it from its context.
	hctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	hello := vlink.PlainHello(hctx, target, f.CongestionControl())
	// A new connection's send buffer takes a hello whole.
	if n, err := unix.Write(fd, hello); n != len(hello) {
		unix.Close(fd)
		if err == nil || err == unix.EAGAIN {
			err = unix.ENOBUFS
		}
		return -1, os.NewSyscallError("write", err)
	}
	var r io.Reader = &pollReader{ctx: ctx, fd: fd, deadline: deadline}
	var ans *answerRecorder
	if rec != nil {
		ans = &answerRecorder{r: r}
		r = ans
	}
	if err := vlink.ReadPlainAnswer(r, hello); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if rec != nil {
		*rec = recipe{gateway: gw, waitMs: uint32(timeout.Milliseconds()), opts: recipeOpts(f), hello: hello, accept: ans.got}
	}
	return fd, nil
}

// recipeOpts returns the options f's PrepareSocket sets, for a recipe.
func recipeOpts(f *tcp.Factory) []recipeOpt {
	var opts []recipeOpt
	for _, o := range f.SocketOptions() {
		ro := recipeOpt{level: uint16(o.Level), name: uint16(o.Name), kind: optInt, val: binary.BigEndian.AppendUint32(nil, uint32(int32(o.Int)))}
		if o.Str != "" {
			ro.kind, ro.val = optBytes, []byte(o.Str)
		}
		opts = append(opts, ro)
	}
	return opts
}

// answerRecorder keeps what the gateway's answer was made of.
type answerRecorder struct {
	r   io.Reader
	got []byte
}

func (a *answerRecorder) Read(b []byte) (int, error) {
	n, err := a.r.Read(b)
	a.got = append(a.got, b[:n]...)
	return n, err
}

// pollReader reads a socket with no more bytes than asked, waiting in
// poll(2) until the deadline (then os.ErrDeadlineExceeded), in slices so
// that ctx's end is noticed.
type pollReader struct {
	ctx      context.Context
	fd       int
	deadline time.Time
}

func (r *pollReader) Read(b []byte) (int, error) {
	pfd := []unix.PollFd{{Fd: int32(r.fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Read(r.fd, b)
		switch {
		case err == nil && n == 0 && len(b) > 0:
			return 0, io.EOF
		case err == nil:
			return n, nil
		case err != unix.EAGAIN && err != unix.EINTR:
			return 0, os.NewSyscallError("read", err)
		}
		left := time.Until(r.deadline)
		if left <= 0 {
			return 0, os.ErrDeadlineExceeded
		}
		if err := r.ctx.Err(); err != nil {
			return 0, err
		}
		if _, err := unix.Poll(pfd, int(min(left, pollSlice).Milliseconds())+1); err != nil && err != unix.EINTR {
			return 0, os.NewSyscallError("poll", err)
		}
	}
}
