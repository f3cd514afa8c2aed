// Package ssh is vlink's SSH factory: the "ssh" layer reaches the
// destination through an SSH server, as ssh -L, ssh -W and ssh -R do, over
// golang.org/x/crypto/ssh. The SSH server is reached through the layer
// below, so jump hosts are SSH over SSH (ssh:host=inner+ssh:host=bastion)
// and SSH goes through SOCKS or HTTP proxies the same way.
//
//   - Dials open a direct-tcpip channel to the destination, whose name the
//     SSH server resolves. In netcat mode (mode=netcat), for servers that
//     forbid forwarding, they run a command on the server instead
//     ("nc -N {host} {port}") and carry its standard input and output.
//   - Listen asks the server to listen on its side (tcpip-forward, as
//     ssh -R does) and accepts the connections it forwards, so a service
//     behind a firewall is published through a bastion. If the SSH
//     connection drops, the listener connects again and asks again.
//   - Start runs a command on the server, as `ssh host command` does
//     (vlink launch starts its remote workers so).
//   - All dials, listeners and commands that go to the same server by the same path
//     share one SSH connection, kept alive with keepalive@openssh.com
//     requests, closed after it has been idle for a while (persist), and
//     made again when a dial finds it gone.
//   - Authentication uses the agent (SSH_AUTH_SOCK) and key files, asking
//     for a key's passphrase on the terminal when there is one; the user's
//     ~/.ssh/config supplies HostName, User, Port, IdentityFile and
//     ProxyJump, so existing setups work as they are.
//   - Host keys are checked against known_hosts. An unknown or changed key
//     is refused with a *HostKeyError naming the host, the key type and its
//     fingerprint; host-key-check=accept-new records unknown keys (never
//     changed ones), as OpenSSH's StrictHostKeyChecking=accept-new does.
//     Not checking at all is possible only as host-key-check=insecure-ignore.
//
// Connections honour the whole net.Conn contract, which x/crypto/ssh's
// channels do not: deadlines (user-space, after net.Pipe's), Close that
// unblocks everything, CloseWrite that sends the channel's EOF, and a lost
// SSH connection reported as an error rather than as the end of the stream.
//
// Importing the package registers the layer with package vlink.
package ssh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/vlink-dev/vlink/factories/internal/hop"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// Defaults for zero Options fields.
const (
	DefaultKeepAlive = 30 * time.Second
	DefaultPersist   = 5 * time.Minute
	DefaultCommand   = "nc -N {host} {port}"
	// keepAliveCount is how many intervals a keepalive may go unanswered
	// before the connection is taken as dead, as OpenSSH's
	// ServerAliveCountMax.
	keepAliveCount = 3
)

func init() {
	layer.Register(layer.Spec{
		Name:    "ssh",
		Kind:    layer.KindFactory,
		Summary: "SSH tunnels (direct-tcpip, netcat mode, reverse listening), one shared SSH connection per server",
		Params: []layer.Param{
			{Name: "host", Type: layer.TypeString, Required: true, Hop: true,
				Doc: "the SSH server: a name, an address or a Host alias of ~/.ssh/config, as [user@]host[:port]"},
			{Name: "port", Type: layer.TypeInt, Min: 0, Max: 65535,
				Doc: "the server's port (default: from ~/.ssh/config, else 22)"},
			{Name: "user", Type: layer.TypeString,
				Doc: "the user to log in as (default: from ~/.ssh/config, else the local user)"},
			{Name: "identity", Type: layer.TypeString,
				Doc: "private key file (default: IdentityFile from ~/.ssh/config, else ~/.ssh/id_ed25519, id_ecdsa, id_rsa)"},
			{Name: "agent", Type: layer.TypeBool, Default: "true",
				Doc: "use the keys of the agent at SSH_AUTH_SOCK"},
			{Name: "known-hosts", Type: layer.TypeString,
				Doc: "known_hosts file to check host keys against (default: ~/.ssh/known_hosts, then /etc/ssh/ssh_known_hosts)"},
			{Name: "host-key-check", Type: layer.TypeString, Default: "strict",
				Doc: `"strict": refuse unknown and changed host keys; "accept-new": record unknown keys in known_hosts, refuse changed ones; "insecure-ignore": check nothing (anyone on the path can pose as the server)`},
			{Name: "config", Type: layer.TypeString,
				Doc: `ssh config file to read HostName, User, Port, IdentityFile and ProxyJump from (default: ~/.ssh/config and /etc/ssh/ssh_config; "none" reads none)`},
			{Name: "mode", Type: layer.TypeString, Default: "forward",
				Doc: `"forward": direct-tcpip channels (ssh -L); "netcat": run command on the server and carry its stdin/stdout, for servers that forbid forwarding`},
			{Name: "command", Type: layer.TypeString, Default: DefaultCommand,
				Doc: "netcat mode's command, {host} and {port} replaced by the destination's (write spaces as %20 in a stack)"},
			{Name: "keepalive", Type: layer.TypeDuration, Default: DefaultKeepAlive.String(), Min: 0, Max: int64(time.Hour),
				Doc: "interval of keepalive requests; three unanswered ones close the connection (0: none)"},
			{Name: "persist", Type: layer.TypeDuration, Default: DefaultPersist.String(), Min: 0, Max: int64(24 * time.Hour),
				Doc: "how long a shared SSH connection stays open with no tunnelled connection left (0: close it with the last one)"},
			{Name: "share", Type: layer.TypeBool, Default: "true",
				Doc: "share one SSH connection among all tunnels to the same server by the same path; false: one SSH connection per tunnel"},
			{Name: "cipher", Type: layer.TypeString,
				Doc: "the only cipher to offer, e.g. aes128-gcm@openssh.com or chacha20-poly1305@openssh.com (default: x/crypto/ssh's preference list)"},
		},
		New: func(a layer.Args) (any, error) { return fromArgs(a) },
	})
}

func fromArgs(a layer.Args) (*Factory, error) {
	o := Options{
		Host:       a.String("host"),
		Port:       a.Int("port"),
		User:       a.String("user"),
		NoAgent:    !a.Bool("agent"),
		ConfigFile: a.String("config"),
		Command:    a.String("command"),
		KeepAlive:  a.Duration("keepalive"),
		Persist:    a.Duration("persist"),
		NoShare:    !a.Bool("share"),
	}
	if s := a.String("identity"); s != "" {
		o.IdentityFiles = []string{s}
	}
	if s := a.String("known-hosts"); s != "" {
		o.KnownHosts = []string{s}
	}
	if s := a.String("cipher"); s != "" {
		o.Ciphers = []string{s}
	}
	if o.KeepAlive == 0 {
		o.KeepAlive = -1 // the parameter's 0 is off; the field's 0 is the default
	}
	if o.Persist == 0 {
		o.Persist = -1
	}
	switch m := a.String("mode"); m {
	case "forward":
	case "netcat":
		o.Netcat = true
	default:
		return nil, fmt.Errorf("%w: mode=%q: want forward or netcat", layer.ErrBadParam, m)
	}
	switch p := a.String("host-key-check"); p {
	case "strict":
	case "accept-new":
		o.HostKeyCheck = AcceptNew
	case "insecure-ignore":
		o.HostKeyCheck = InsecureIgnoreHostKey
	default:
		return nil, fmt.Errorf("%w: host-key-check=%q: want strict, accept-new or insecure-ignore", layer.ErrBadParam, p)
	}
	return New(o)
}

// Options configure a Factory. The zero value of every field but Host
// is usable and does what ssh does with no options.
type Options struct {
	// Host is the SSH server as the user writes it to ssh: a name, an
	// address or a Host alias of the ssh config, as [user@]host[:port].
	Host string
	// Port is the server's port. Zero: from the ssh config, else 22.
	Port int
	// User is the user to log in as. Empty: from the ssh config, else
	// the local user.
	User string
	// IdentityFiles are private key files to authenticate with. Empty:
	// the ssh config's IdentityFile, else ~/.ssh/id_ed25519, id_ecdsa
	// and id_rsa where they exist.
	IdentityFiles []string
	// NoAgent, if true, does not use the agent at SSH_AUTH_SOCK.
	NoAgent bool
	// KnownHosts are the known_hosts files. Empty: ~/.ssh/known_hosts,
	// then /etc/ssh/ssh_known_hosts. AcceptNew records new keys in the
	// first one.
	KnownHosts []string
	// HostKeyCheck says what to do with a host key known_hosts does not
	// hold. Zero: refuse it.
	HostKeyCheck HostKeyCheck
	// ConfigFile is the ssh config to read. Empty: ~/.ssh/config, then
	// /etc/ssh/ssh_config. "none": no config.
	ConfigFile string
	// Netcat, if true, reaches destinations by running Command on the
	// server instead of opening direct-tcpip channels.
	Netcat bool
	// Command is netcat mode's command; {host} and {port} are replaced by
	// the destination's. Empty: DefaultCommand.
	Command string
	// KeepAlive is the interval of keepalive requests. Zero:
	// DefaultKeepAlive; negative: none.
	KeepAlive time.Duration
	// Persist is how long a shared SSH connection stays open with nothing
	// using it. Zero: DefaultPersist; negative: it closes with its last
	// user.
	Persist time.Duration
	// NoShare, if true, gives every dial and listener an SSH connection
	// of its own.
	NoShare bool
	// Ciphers, if set, are the only ciphers offered, in order of
	// preference.
	Ciphers []string
	// Prompt asks the user for a key's passphrase. Nil: ask on the
	// controlling terminal if there is one, else fail that key with an
	// error saying to add it to the agent.
	Prompt func(question string) ([]byte, error)
}

// A Factory dials and listens through an SSH server. It implements
// layer.ListenFactory and is safe for concurrent use.
type Factory struct {
	o Options
	t target // the server, with the ssh config applied
}

var _ layer.ListenFactory = (*Factory)(nil)

// New returns a Factory for the options, with the ssh config applied.
// Errors match layer.ErrBadParam.
func New(o Options) (*Factory, error) {
	if o.Host == "" {
		return nil, fmt.Errorf("%w: no SSH server (host)", layer.ErrBadParam)
	}
	if o.Port < 0 || o.Port > 65535 {
		return nil, fmt.Errorf("%w: port %d", layer.ErrBadParam, o.Port)
	}
	if o.Command == "" {
		o.Command = DefaultCommand
	}
	if o.Netcat && (!strings.Contains(o.Command, "{host}") || !strings.Contains(o.Command, "{port}")) {
		return nil, fmt.Errorf("%w: command=%q must contain {host} and {port}", layer.ErrBadParam, o.Command)
	}
	if o.KeepAlive == 0 {
		o.KeepAlive = DefaultKeepAlive
	}
	if o.Persist == 0 {
		o.Persist = DefaultPersist
	}
	if o.HostKeyCheck > InsecureIgnoreHostKey {
		return nil, fmt.Errorf("%w: unknown host key check %d", layer.ErrBadParam, o.HostKeyCheck)
	}
	if len(o.Ciphers) > 0 {
		supported := gossh.SupportedAlgorithms().Ciphers
		for _, c := range o.Ciphers {
			found := false
			for _, s := range supported {
				found = found || s == c
			}
			if !found {
				return nil, fmt.Errorf("%w: cipher %q (supported: %s)", layer.ErrBadParam, c, strings.Join(supported, ", "))
			}
		}
	}
	t, err := resolve(o)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", layer.ErrBadParam, err)
	}
	return &Factory{o: o, t: t}, nil
}

// String describes the factory: the user and server it logs in to.
func (f *Factory) String() string { return "ssh " + f.t.String() }

// Errors matched by failed dials and listens (with errors.Is). Host key
// refusals are a *HostKeyError, which matches ErrHostKeyUnknown,
// ErrHostKeyChanged or ErrHostKeyRevoked.
var (
	// ErrAuth: the server accepted none of our keys. It matches
	// vlink.ErrAuth too.
	ErrAuth = fmt.Errorf("ssh: %w", layer.ErrAuth)
	// ErrOpenRefused: the server would not open the channel: forwarding
	// forbidden, destination unreachable, too many sessions. The
	// *OpenError says which.
	ErrOpenRefused = errors.New("ssh: server refused the channel")
	// ErrListenRefused: the server would not listen for us
	// (tcpip-forward denied: AllowTcpForwarding, GatewayPorts, a port in
	// use).
	ErrListenRefused = errors.New("ssh: server refused to listen")
	// ErrLost: the SSH connection ended under a tunnelled connection.
	ErrLost = errors.New("ssh: connection to the server lost")
	// ErrCommand: netcat mode's command failed before carrying any data.
	ErrCommand = errors.New("ssh: netcat command failed")
)

// An OpenError is a server's refusal to open a channel. It matches
// ErrOpenRefused; a destination the server could not connect to also
// matches vlink.ErrUnreachable, a prohibited one vlink.ErrNotAllowed.
type OpenError struct {
	Reason  gossh.RejectionReason
	Message string
}

func (e *OpenError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("server refused the channel: %v", e.Reason)
	}
	return fmt.Sprintf("server refused the channel: %v: %s", e.Reason, e.Message)
}

// Is makes the error match ErrOpenRefused and the sentinel of its reason.
func (e *OpenError) Is(target error) bool {
	switch target {
	case ErrOpenRefused:
		return true
	case layer.ErrUnreachable:
		return e.Reason == gossh.ConnectionFailed
	case layer.ErrNotAllowed:
		return e.Reason == gossh.Prohibited
	}
	return false
}

// DialContext connects to address through the SSH server, which it
// reaches through forward (nil: a net.Dialer) unless the shared
// connection to it is already up. The context bounds the setup: the SSH
// handshake if one is needed (layer.DefaultHandshakeTimeout if the context
// sets no deadline), and opening the channel.
func (f *Factory) DialContext(ctx context.Context, network, address string, forward layer.ContextDialer) (net.Conn, error) {
	fail := func(err error) (net.Conn, error) { return nil, hop.Error("dial", "ssh", f.t.addr(), err) }
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return fail(net.UnknownNetworkError(network))
	}
	host, port, err := splitDest(address)
	if err != nil {
		return fail(fmt.Errorf("destination %q: %w", address, err))
	}
	sess, err := f.session(ctx, forward)
	if err != nil {
		return fail(err)
	}
	var c net.Conn
	if f.o.Netcat {
		c, err = openNetcat(ctx, sess, f.o.Command, host, port, address)
	} else {
		c, err = openDirect(ctx, sess, host, port, address)
	}
	if err != nil {
		sess.release()
		return fail(fmt.Errorf("to %s: %w", address, err))
	}
	return c, nil
}

// Listen asks the SSH server to listen on address, on its side (as
// ssh -R does), and returns a listener for the connections it forwards.
// Whether the server listens beyond its loopback depends on its
// GatewayPorts setting. If the SSH connection drops, Accept connects again
// and asks the server to listen on the same port again, backing off
// between attempts, until Close.
func (f *Factory) Listen(ctx context.Context, network, address string, forward layer.ContextDialer) (net.Listener, error) {
	fail := func(err error) (net.Listener, error) { return nil, hop.Error("listen", "ssh", f.t.addr(), err) }
	if network != "tcp" && network != "tcp4" && network != "tcp6" {
		return fail(net.UnknownNetworkError(network))
	}
	if _, _, err := net.SplitHostPort(address); err != nil {
		return fail(err)
	}
	return f.listen(ctx, address, forward)
}

// splitDest splits host:port and checks the port.
func splitDest(address string) (string, int, error) {
	host, ps, err := net.SplitHostPort(address)
	if err != nil {
		return "", 0, err
	}
	if host == "" {
		return "", 0, errors.New("no host")
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || port == 0 {
		return "", 0, fmt.Errorf("port %q is not a number from 1 to 65535", ps)
	}
	return host, int(port), nil
}
