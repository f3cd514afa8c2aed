package ssh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/vlink-dev/vlink/factories/internal/hop"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// openChannel opens a channel, bounded by ctx (or
// layer.DefaultHandshakeTimeout): x/crypto/ssh waits for the server's
// answer without a deadline. A channel that opens after we gave up is
// closed.
func openChannel(ctx context.Context, client *gossh.Client, kind string, payload []byte) (gossh.Channel, <-chan *gossh.Request, error) {
	type result struct {
		ch   gossh.Channel
		reqs <-chan *gossh.Request
		err  error
	}
	done := make(chan result, 1)
	go func() {
		ch, reqs, err := client.OpenChannel(kind, payload)
		done <- result{ch, reqs, err}
	}()
	timeout := layer.DefaultHandshakeTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var giveUp error
	select {
	case r := <-done:
		var oce *gossh.OpenChannelError
		if errors.As(r.err, &oce) {
			return nil, nil, &OpenError{Reason: oce.Reason, Message: oce.Message}
		}
		return r.ch, r.reqs, r.err
	case <-ctx.Done():
		giveUp = ctx.Err()
	case <-timer.C:
		giveUp = fmt.Errorf("no answer to the channel open within %v: %w", timeout, context.DeadlineExceeded)
	}
	go func() {
		if r := <-done; r.err == nil {
			go gossh.DiscardRequests(r.reqs)
			r.ch.Close()
		}
	}()
	return nil, nil, giveUp
}

// destAddr is the net.Addr of a destination: a *net.TCPAddr for an IP
// address, the name as given otherwise.
func destAddr(address string) net.Addr {
	if ap, err := netip.ParseAddrPort(address); err == nil {
		return net.TCPAddrFromAddrPort(ap)
	}
	return hop.Addr{Net: "tcp", Host: address}
}

// openDirect opens a direct-tcpip channel to host:port; the server
// resolves the name.
func openDirect(ctx context.Context, s *session, host string, port int, address string) (net.Conn, error) {
	payload := gossh.Marshal(&struct {
		Raddr string
		Rport uint32
		Laddr string
		Lport uint32
	}{host, uint32(port), "0.0.0.0", 0})
	ch, reqs, err := openChannel(ctx, s.client, "direct-tcpip", payload)
	if err != nil {
		return nil, err
	}
	go gossh.DiscardRequests(reqs)
	c := newConn(ch, s.tr.LocalAddr(), destAddr(address), s.lost, s.release)
	c.start()
	return c, nil
}

// stderrKeep bounds what is kept of a netcat command's standard error,
// for the error message if it fails.
const stderrKeep = 2 << 10

// netcatWait bounds how long a netcat tunnel that ended without sending a
// byte waits for the command's exit status, to tell a failed command from
// a destination that closed at once.
const netcatWait = 500 * time.Millisecond

// openNetcat runs the netcat command on the server in a session channel
// and carries its standard input and output.
func openNetcat(ctx context.Context, s *session, command, host string, port int, address string) (net.Conn, error) {
	cmd := strings.NewReplacer("{host}", shellQuote(host), "{port}", strconv.Itoa(port)).Replace(command)
	ch, reqs, err := openChannel(ctx, s.client, "session", nil)
	if err != nil {
		return nil, err
	}
	nc := &netcat{cmd: cmd, exited: make(chan struct{})}
	// The channel's requests: exit-status and exit-signal tell how the
	// command ended; they must be read, or the connection stalls.
	go nc.requests(reqs)
	// Standard error shares the channel's window: it must be drained,
	// or a chatty command stalls the tunnel. The tail is kept.
	go nc.stderr(ch.Stderr())
	ok, err := sendRequest(ctx, ch, "exec", gossh.Marshal(&struct{ Command string }{cmd}))
	if err == nil && !ok {
		err = fmt.Errorf("%w: the server refused to run %q", ErrCommand, cmd)
	}
	if err != nil {
		ch.Close()
		return nil, err
	}
	c := newConn(ch, s.tr.LocalAddr(), destAddr(address), s.lost, s.release)
	c.onEOF = nc.onEOF
	c.start()
	return c, nil
}

// sendRequest sends a channel request and waits for the answer, bounded
// by ctx (or layer.DefaultHandshakeTimeout).
func sendRequest(ctx context.Context, ch gossh.Channel, name string, payload []byte) (bool, error) {
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ok, err := ch.SendRequest(name, true, payload)
		done <- result{ok, err}
	}()
	timeout := layer.DefaultHandshakeTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.ok, r.err
	case <-ctx.Done():
		return false, ctx.Err()
	case <-timer.C:
		return false, fmt.Errorf("no answer to %s within %v: %w", name, timeout, context.DeadlineExceeded)
	}
}

// shellQuote quotes s for a POSIX shell: the server runs the command
// through the user's shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// netcat follows a netcat command's end.
type netcat struct {
	cmd    string
	mu     sync.Mutex
	status int  // exit status, -1 for a signal
	exit   bool // status is known
	tail   []byte
	exited chan struct{}
	once   sync.Once
}

func (n *netcat) requests(reqs <-chan *gossh.Request) {
	defer n.once.Do(func() { close(n.exited) })
	for r := range reqs {
		switch r.Type {
		case "exit-status":
			var st struct{ Status uint32 }
			if gossh.Unmarshal(r.Payload, &st) == nil {
				n.mu.Lock()
				n.status, n.exit = int(st.Status), true
				n.mu.Unlock()
			}
		case "exit-signal":
			n.mu.Lock()
			n.status, n.exit = -1, true
			n.mu.Unlock()
		}
		if r.WantReply {
			r.Reply(false, nil)
		}
		if n.exit {
			n.once.Do(func() { close(n.exited) })
		}
	}
}

func (n *netcat) stderr(r io.Reader) {
	buf := make([]byte, 1024)
	for {
		m, err := r.Read(buf)
		if m > 0 {
			n.mu.Lock()
			n.tail = append(n.tail, buf[:m]...)
			if len(n.tail) > stderrKeep {
				n.tail = append(n.tail[:0], n.tail[len(n.tail)-stderrKeep:]...)
			}
			n.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// onEOF turns the end of a tunnel that never carried a byte into the
// command's failure, if it failed: nc cannot connect, or is missing.
func (n *netcat) onEOF(received int64) error {
	if received > 0 {
		return nil
	}
	select {
	case <-n.exited:
	case <-time.After(netcatWait):
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.exit || n.status == 0 {
		return nil
	}
	msg := strings.TrimSpace(string(n.tail))
	if msg == "" {
		msg = "no message"
	}
	return fmt.Errorf("%w: %q exited with status %d: %s", ErrCommand, n.cmd, n.status, msg)
}
