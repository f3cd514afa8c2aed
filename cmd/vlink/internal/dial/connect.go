package dial

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/netconn"
)

var ConnectCmd = &cli.Command{
	Name:     "connect",
	Summary:  "carry standard input and output through a stack to HOST:PORT (an ssh ProxyCommand)",
	Synopsis: "[flags] HOST:PORT | HOST PORT",
	About: `
Reaches HOST:PORT through a stack, as "vlink tunnel" would, and carries
standard input to it and what it sends back to standard output: ssh's
ProxyCommand, git's core.sshCommand, or any program that talks to a
command's stdin and stdout (as ssh -W and nc do).

The end of standard input half-closes the connection: the far side sees
the end of the stream and can still answer. The end of the far side's
stream closes standard output. vlink connect exits once both have ended,
with status 0. If the far side's stream is cut short (a reset, a server
killed, a missing end marker of a filtered stack) or cannot be reached,
it says why on stderr and exits with status 1, so a cut transfer never
looks complete; on SIGINT or SIGTERM it resets the connection and exits
with status 1.

When the program reading standard output goes away (SIGHUP, which ssh
sends its ProxyCommand once done, or a closed pipe), what it wrote to
standard input is still delivered and ended properly, then the
connection is closed and vlink connect exits with status 1, quietly, as
a hung-up program does. If standard input has not ended 2 s later, the
connection is reset instead.

The destination is one argument, HOST:PORT, or two, HOST PORT (ssh's
%h %p, which also suits IPv6 addresses); flags go before it. Without
--stack, the user's configuration decides, as for vlink tunnel. Logs go
to stderr: errors, and the first pin of a listener's identity.
`,
	Examples: `
  # ssh through the gateway 127.0.0.1:7000 (vlink serve --allow), zstd on
  # the wire; the gateway connects to the ssh server:
  ssh -o ProxyCommand='vlink connect --stack zstd --via 127.0.0.1:7000 %h %p' user@db.internal

  # The same for git over ssh:
  git -c core.sshCommand="ssh -o ProxyCommand='vlink connect --stack zstd --via 127.0.0.1:7000 %h %p'" \
      clone ssh://git@git.internal/project.git

  # A request and its answer, as with nc -N:
  printf 'PING\r\n' | vlink connect --stack tcp 127.0.0.1:6379
`,
	Flags: base.WithEnv(connectFlags),
	Args:  true,
}

type connectOptions struct {
	dialOptions
}

func connectFlags(fs *flag.FlagSet) func(context.Context, *base.Env) int {
	o := &connectOptions{dialOptions{toName: "HOST:PORT"}}
	fs.StringVar(&o.stack, "stack", "", "carry the connection through `STACK`, e.g. zstd, lz4+tcp or socks5h://proxy:1080; a filter (identity, zstd, ...) marks the end, so a stream cut short is an error, where tcp alone, byte for byte, ends as TCP does (default: the user's configuration decides)")
	fs.StringVar(&o.via, "via", "", "go through the VLink gateway at `HOST:PORT` (vlink serve --allow), which connects to the destination; or through a chain of nodes, HOST:PORT,HOST:PORT,...: the first is reached first and forwards to the next (vlink serve --hop), the last is the gateway. Needs --stack (default: none)")
	fs.StringVar(&o.keyFile, "key-file", "", "prove to the server that we hold the pre-shared key in `FILE`; needs --stack (default: none, or the configuration's)")
	fs.DurationVar(&o.dialTimeout, "dial-timeout", 10*time.Second, "give up reaching the destination, handshake included, after `DURATION`")
	base.InsecurePlaintextVar(fs, &o.insecurePlaintext)
	base.KnownNodesVar(fs, &o.knownNodes)
	base.NodeFlags(fs, &o.node, "to reach NODE.vlink.alt:PORT, another node's port, through the relay")
	return func(ctx context.Context, e *base.Env) int {
		if err := o.run(ctx, e); err != nil {
			return base.Fail(e, "vlink connect", err)
		}
		return base.ExitOK
	}
}

// destination reads the arguments: HOST:PORT, or HOST PORT.
func destination(args []string) (string, error) {
	for _, a := range args {
		if len(a) > 1 && a[0] == '-' {
			return "", base.Usagef("%s after the destination: flags go before HOST:PORT", a)
		}
	}
	switch len(args) {
	case 1:
		if _, _, err := net.SplitHostPort(args[0]); err != nil {
			return "", base.Usagef("%q: want HOST:PORT, or HOST PORT (ssh's %%h %%p, for IPv6 addresses)", args[0])
		}
		return args[0], nil
	case 2:
		return net.JoinHostPort(args[0], args[1]), nil
	case 0:
		return "", base.Usagef("no destination: give HOST:PORT (or HOST PORT) after the flags")
	}
	return "", base.Usagef("%d arguments: want HOST:PORT, or HOST PORT", len(args))
}

func (o *connectOptions) run(ctx context.Context, e *base.Env) error {
	to, err := destination(e.Args)
	if err != nil {
		return err
	}
	o.to = to
	d, closeDialer, err := o.open(ctx, e)
	if err != nil {
		return err
	}
	defer closeDialer()
	c, err := d.DialContext(ctx, "tcp", o.to)
	if err != nil {
		return err
	}
	// SIGPIPE would kill the process on the first write to a stdout
	// nobody reads, and the kernel would close the socket as if our
	// stream had ended; as an error, the relay decides. SIGHUP is how
	// ssh ends its ProxyCommand, at once after closing its pipes.
	signal.Ignore(syscall.SIGPIPE)
	hangup := make(chan os.Signal, 1)
	signal.Notify(hangup, syscall.SIGHUP)
	defer signal.Stop(hangup)
	start := time.Now()
	r := &stdioRelay{c: c, stdin: e.Stdin, stdout: e.Stdout, hangup: hangup, grace: consumerGoneGrace}
	err = r.run(ctx)
	e.Log.Debug("connection closed", "to", o.to, "bytes_up", r.up.Load(), "bytes_down", r.down.Load(),
		"took", time.Since(start).Round(time.Millisecond), "err", err)
	if errors.Is(err, errConsumerGone) {
		return &cli.ExitError{Code: base.ExitFailure} // quietly: nobody to tell
	}
	return err
}

// consumerGoneGrace is how long, once the program at the other end of
// stdin and stdout has gone (a hangup, a broken stdout), the relay waits
// for the end of stdin before it resets the connection: ssh closes its
// pipes and sends SIGHUP at once, with the end of stdin already written.
const consumerGoneGrace = 2 * time.Second

// errConsumerGone ends a relay whose consumer went away (SIGHUP, a
// broken stdout): quietly, as SIGHUP and SIGPIPE end a program.
var errConsumerGone = errors.New("the program reading standard output has gone")

// errHangup is SIGHUP's reason.
var errHangup = errors.New("hung up")

// A stdioRelay carries stdin to c and c to stdout, as ssh -W does: the
// end of stdin half-closes c, the end of c's stream closes stdout (if it
// is an io.Closer), and run returns once both ended, closing c.
//
// A failure of the far side or of stdin resets c and returns at once,
// without waiting for a read of stdin that nothing can interrupt; so
// does the end of ctx. A consumer gone (SIGHUP, or a write to stdout
// failing) is different: what it wrote before it went is delivered
// whole, so the relay waits up to grace for the end of stdin and then
// closes c normally; the far side's unread bytes are the consumer's to
// drop. Past grace, the relay resets c.
type stdioRelay struct {
	c      net.Conn
	stdin  io.Reader
	stdout io.Writer
	hangup <-chan os.Signal
	grace  time.Duration

	up, down atomic.Int64 // bytes carried each way, as they go
}

func (r *stdioRelay) run(ctx context.Context) error {
	ups, downs := make(chan error, 1), make(chan error, 1)
	go func() { ups <- copyUp(r.c, r.stdin, &r.up) }()
	go func() {
		err := copyDown(r.stdout, r.c, &r.down)
		if cl, ok := r.stdout.(io.Closer); ok {
			cl.Close() // the consumer sees the end (or the cut) now
		}
		downs <- err
	}()
	var (
		upDone, downDone bool
		gone             error            // why the consumer is gone
		graceOver        <-chan time.Time // once it is
		stopTimer        = func() bool { return false }
	)
	consumerGone := func(why error) {
		if gone == nil || why == errHangup {
			gone = why
		}
		if graceOver == nil {
			t := time.NewTimer(r.grace)
			stopTimer = t.Stop
			graceOver = t.C
		}
	}
	defer func() { stopTimer() }()
	for {
		switch {
		case upDone && downDone && gone == nil:
			return r.c.Close()
		case upDone && gone != nil:
			// Everything the consumer wrote went through, ended.
			r.c.Close()
			return fmt.Errorf("%w (%w)", errConsumerGone, gone)
		}
		select {
		case err := <-ups:
			upDone = true
			// A peer that ended its stream and then reset rather than
			// read the rest of ours: the down direction says whether its
			// stream was whole.
			if err != nil && !netconn.ResetByPeer(err) {
				netconn.Abort(r.c)
				return err
			}
		case err := <-downs:
			downDone = true
			var werr *writeError
			switch {
			case errors.As(err, &werr):
				consumerGone(err)
			case err != nil:
				netconn.Abort(r.c)
				return err
			}
		case <-r.hangup:
			consumerGone(errHangup)
		case <-graceOver:
			netconn.Abort(r.c)
			return fmt.Errorf("%w (%w), and standard input did not end within %v: connection reset", errConsumerGone, gone, r.grace)
		case <-ctx.Done():
			netconn.Abort(r.c)
			return fmt.Errorf("interrupted: connection reset: %w", ctx.Err())
		}
	}
}

// copyUp sends stdin to c, then the end of the stream.
func copyUp(c net.Conn, stdin io.Reader, n *atomic.Int64) error {
	_, err := io.Copy(c, readerOnly{stdin, n})
	if err != nil {
		var rerr *readError
		if errors.As(err, &rerr) {
			return fmt.Errorf("reading standard input: %w", rerr.err)
		}
		return fmt.Errorf("sending to %v: %w", c.RemoteAddr(), err)
	}
	if err := netconn.CloseWrite(c); err != nil {
		return fmt.Errorf("ending the stream to %v: %w", c.RemoteAddr(), err)
	}
	return nil
}

// copyDown writes what c sends to stdout until the end of c's stream.
func copyDown(stdout io.Writer, c net.Conn, n *atomic.Int64) error {
	_, err := io.Copy(writerOnly{stdout, n}, c)
	if err != nil {
		var werr *writeError
		if errors.As(err, &werr) {
			return fmt.Errorf("writing standard output: %w", werr)
		}
		return fmt.Errorf("receiving from %v: %w", c.RemoteAddr(), err)
	}
	return nil
}

// readerOnly and writerOnly count the bytes carried and tell which side
// of a copy failed, which io.Copy's error does not. They hide
// io.WriterTo and io.ReaderFrom, so the connection's own ReadFrom and
// WriteTo (a splice, a filter's frames written without a copy) still do
// the work.
type readerOnly struct {
	r io.Reader
	n *atomic.Int64
}

func (r readerOnly) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.n.Add(int64(n))
	if err != nil && err != io.EOF {
		err = &readError{err}
	}
	return n, err
}

type writerOnly struct {
	w io.Writer
	n *atomic.Int64
}

func (w writerOnly) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	w.n.Add(int64(n))
	if err != nil {
		err = &writeError{err}
	}
	return n, err
}

type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }
