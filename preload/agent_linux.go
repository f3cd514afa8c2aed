package preload

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// EnvAgent names the agent's socket in the program's environment: "@NAME"
// for an abstract unix socket, which leaves no file behind.
const EnvAgent = "VLINK_AGENT"

// EnvAgentToken holds the agent's secret in the program's environment (32
// hex digits). The shim reads it once, when it is loaded, and shows it in
// the hello of every channel: a process of the program's tree that has
// since become another user (a daemon's worker) proves with it that it
// belongs to the program.
const EnvAgentToken = "VLINK_AGENT_TOKEN"

// Bounds of the agent's work.
const (
	// attachTimeout bounds how long a dialed connection waits for the
	// program's relay connection, and an accepted relay connection for its
	// attach: both come from the same connect call, microseconds apart.
	attachTimeout = 10 * time.Second
	maxChannels   = 4096
	peerWait      = time.Second
	maxOrphans    = 1024
	// closeDrain is how long Close lets relays end by themselves before it
	// aborts them (see Close).
	closeDrain = time.Second
	// releaseTimeout bounds the simultaneous open that wakes a held
	// socket: microseconds on loopback, or a reset at once if the program
	// closed it.
	releaseTimeout = 2 * time.Second
	// maxFailed bounds the errnos kept for the shims' msgWhy; each is
	// asked for within microseconds of its reset, and forgotten after
	// failedKeep.
	maxFailed  = 4096
	failedKeep = time.Minute
)

// AgentConfig configures an Agent. The zero value sends every connection
// direct.
type AgentConfig struct {
	// Config holds the routing rules, as vlink.Dial reads them. Nil means
	// every destination is direct.
	Config *vlink.Config
	// DialTimeout bounds a dial through a stack, handshake included. Zero
	// means as long as the kernel's own connect waits for a host that
	// does not answer (KernelConnectTimeout): a program's connect then
	// ends as without vlink, by its own timeout or the kernel's, the
	// gateway waiting as long (vlink serve --max-dial-timeout). A
	// blocking connect with SO_SNDTIMEO set gets the shorter of the two.
	DialTimeout time.Duration
	// Logger gets a debug line per decision and an info line per failed
	// connection. Nil discards.
	Logger *slog.Logger
	// Network reaches the nodes of a vlink network: a program's connect
	// to NODE.vlink.alt:PORT goes there (vlink exec --node). Nil: such
	// connects fail, and their names never reach the DNS.
	Network vlink.NodeDialer
	// Member makes the agent's dials a member's (vlink.Dialer.Member):
	// vlink exec --cert. Nil: none.
	Member *vlink.Member
	// InsecurePlaintext keeps the stacks as the rules give them (see
	// vlink.Dialer.InsecurePlaintext). UNSAFE: only for a network that is
	// itself trusted.
	InsecurePlaintext bool
	// StandIns answers a name the far side resolves with stand-in
	// addresses at once, without asking the far side whether the name
	// exists: one round trip less per new name, but a name that does not
	// exist fails at connect, not at resolution. False (the default)
	// asks the route's gateway (vlink.Dialer.LookupHost), caches the
	// answer, reports a name it does not know as the resolver would, and
	// hands out stand-ins of the families the name has; when the far
	// side cannot answer, the stand-ins come anyway.
	StandIns bool
	// Observe, if set, is told how each of the program's connects was
	// answered, once it is. It must not block: it is meant for metrics.
	Observe func(ConnectOutcome)
	// Serve, if set, makes the program's listeners on its ports take
	// VLink clients (served_linux.go). Nil: listeners are left alone.
	Serve *ServeConfig
}

// A ConnectOutcome is how the agent answered a program's connect.
type ConnectOutcome uint8

const (
	ConnectRouted  ConnectOutcome = iota // carried through a stack
	ConnectDirect                        // left to the program, as the rules say
	ConnectRefused                       // refused by the rules (EPERM)
	ConnectFailed                        // routed, and the stack did not reach the destination
)

var connectOutcomes = [...]string{"routed", "direct", "refused", "failed"}

func (o ConnectOutcome) String() string {
	if int(o) < len(connectOutcomes) {
		return connectOutcomes[o]
	}
	return "outcome " + strconv.Itoa(int(o))
}

// An Agent answers the shims of one program's processes: it decides each
// connect with the rules, dials through stacks, hands back descriptors or
// relays, and keeps the fake addresses of far-side names. It serves from
// NewAgent until Close.
type Agent struct {
	router *router
	// stacks dials every routed connect, as one Go program's vlink.Dial:
	// connects along one path share its multi-link layers (a mux
	// session), and a best-effort route remembers the way that won.
	stacks  *vlink.Dialer
	direct  net.Dialer // far-side names whose rule says direct
	fakes   *fakeMap
	ask     bool // !AgentConfig.StandIns
	lookups lookupCache
	timeout time.Duration
	log     *slog.Logger
	observe func(ConnectOutcome) // nil: none
	uid     int                  // processes of this user are served (see serveChannel)
	pid     int                  // and so are those of this process's tree holding token
	token   [tokenSize]byte

	name   string
	ln     *net.UnixListener
	relay4 *net.TCPListener
	relay6 *net.TCPListener // nil without IPv6 loopback
	held4  *heldListener    // non-blocking connects wait here (held_linux.go)
	held6  *heldListener    // nil without IPv6 loopback

	mu        sync.Mutex
	closed    bool
	channels  int
	nextToken uint64
	pending   map[uint64]*pending         // by token
	byLocal   map[netip.AddrPort]*pending // attached, by the program side's address
	orphans   map[netip.AddrPort]orphan   // relay connections whose attach has not come yet
	peers     map[netip.AddrPort]sockAddr // live relays: program side -> what it asked for
	failed    map[uint64]failure          // held connects reset, by token, until the shim asks why
	serve     *ServeConfig                // nil: listeners are the program's own
	served    map[netip.AddrPort]*served  // listening in the program's place, by the address it bound
	handed    map[netip.AddrPort]*handed  // clients handed to the program, by the agent's end
	conns     map[io.Closer]struct{}      // channels and connections, closed by Close
	relaying  int                         // relays running
	dgrams    map[*dgramRelay]struct{}    // datagram relays (datagram_linux.go)
	drained   chan struct{}               // closed when the last relay ends, once Close waits

	ctx    context.Context // cancelled by Close: aborts dials
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// An orphan is a relay connection accepted before its attach, closed if
// none comes in time.
type orphan struct {
	c     net.Conn
	timer *time.Timer
}

// A failure is a held connect's dial error, kept for the shim to ask.
type failure struct {
	errno syscall.Errno
	at    time.Time
}

// A pending connection is a dial (in progress or done) waiting for the
// program's relay connection, or the other way round.
type pending struct {
	token   uint64
	channel uint64 // the channel that got the token: only it may attach
	dest    sockAddr
	held    bool                // a non-blocking connect, held in SYN-SENT: attach goes to at
	prog    chan net.Conn       // the program's relay connection, once attached and accepted
	at      chan netip.AddrPort // the held socket's address, once attached
	local   netip.AddrPort
}

// NewAgent starts an agent listening on a fresh abstract unix socket and
// on loopback relay ports.
func NewAgent(c AgentConfig) (*Agent, error) {
	r, err := newRouter(c.Config)
	if err != nil {
		return nil, err
	}
	if c.Serve != nil {
		if err := c.Serve.Validate(); err != nil {
			return nil, err
		}
	}
	var rnd [16]byte
	rand.Read(rnd[:])
	a := &Agent{
		router: r,
		stacks: &vlink.Dialer{
			Config:            r.cfg,
			Network:           c.Network,
			Member:            c.Member,
			InsecurePlaintext: c.InsecurePlaintext,
			// A blocking connect returns the far side's answer, as
			// without the shim: a mux stream's early data must not turn
			// a refusal into a connection that resets on first use.
			WaitAccept: true,
		},
		direct:  net.Dialer{KeepAlive: -1},
		fakes:   newFakeMap(0),
		ask:     !c.StandIns,
		timeout: c.DialTimeout,
		log:     c.Logger,
		observe: c.Observe,
		uid:     os.Getuid(),
		pid:     os.Getpid(),
		name:    "@vlink-agent-" + hex.EncodeToString(rnd[:]),
		pending: map[uint64]*pending{},
		byLocal: map[netip.AddrPort]*pending{},
		orphans: map[netip.AddrPort]orphan{},
		peers:   map[netip.AddrPort]sockAddr{},
		failed:  map[uint64]failure{},
		serve:   c.Serve,
		served:  map[netip.AddrPort]*served{},
		handed:  map[netip.AddrPort]*handed{},
		conns:   map[io.Closer]struct{}{},
		dgrams:  map[*dgramRelay]struct{}{},
	}
	if a.timeout <= 0 {
		a.timeout = KernelConnectTimeout()
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	rand.Read(a.token[:])
	a.ctx, a.cancel = context.WithCancel(context.Background())
	if a.ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: a.name, Net: "unix"}); err != nil {
		return nil, fmt.Errorf("preload: agent socket: %w", err)
	}
	if a.relay4, err = net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		a.ln.Close()
		return nil, fmt.Errorf("preload: relay listener: %w", err)
	}
	// IPv6 loopback may be missing (disabled IPv6): IPv6 sockets then reach
	// the IPv4 listener through an IPv4-mapped address.
	a.relay6, _ = net.ListenTCP("tcp6", &net.TCPAddr{IP: net.IPv6loopback})
	if a.held4, err = heldListen("tcp4", netip.AddrFrom4([4]byte{127, 0, 0, 1})); err != nil {
		a.ln.Close()
		a.relay4.Close()
		if a.relay6 != nil {
			a.relay6.Close()
		}
		return nil, fmt.Errorf("preload: %w", err)
	}
	if a.relay6 != nil {
		a.held6, _ = heldListen("tcp6", netip.IPv6Loopback())
	}
	a.wg.Add(1)
	go a.serveChannels()
	for _, l := range []*net.TCPListener{a.relay4, a.relay6} {
		if l != nil {
			a.wg.Add(1)
			go a.serveRelays(l)
		}
	}
	return a, nil
}

// Name returns the agent's socket name, "@..." for an abstract socket.
func (a *Agent) Name() string { return a.name }

// Env returns the environment variables that point a shim at this agent
// (EnvAgent) and let the program's processes prove they are its own
// (EnvAgentToken).
func (a *Agent) Env() []string {
	return []string{EnvAgent + "=" + a.name, EnvAgentToken + "=" + hex.EncodeToString(a.token[:])}
}

// Close stops the agent: it closes its sockets, lets the relays whose ends
// are done finish (for up to closeDrain), then aborts every connection it
// still relays (a reset: a program must not take a cut stream for a
// complete one), the shims' channels and the dials in progress, and waits
// for its goroutines.
//
// The drain matters because vlink exec closes the agent once the program
// has exited: the kernel closed the program's sockets cleanly, and a relay
// that has not yet read that end would otherwise reset a far side that got
// every byte, where without vlink it would have seen the program's FIN.
func (a *Agent) Close() error {
	a.once.Do(func() {
		a.mu.Lock()
		a.closed = true
		a.ln.Close()
		a.relay4.Close()
		if a.relay6 != nil {
			a.relay6.Close()
		}
		a.held4.Close()
		if a.held6 != nil {
			a.held6.Close()
		}
		a.closeServed()
		var drained chan struct{}
		if a.relaying > 0 {
			a.drained = make(chan struct{})
			drained = a.drained
		}
		a.mu.Unlock()
		if drained != nil {
			timer := time.NewTimer(closeDrain)
			select {
			case <-drained:
			case <-timer.C:
			}
			timer.Stop()
		}
		a.mu.Lock()
		for c := range a.conns {
			if nc, ok := c.(net.Conn); ok {
				netconn.Abort(nc)
			} else {
				c.Close()
			}
		}
		for _, o := range a.orphans {
			o.timer.Stop()
			o.c.Close()
		}
		a.mu.Unlock()
		a.cancel()
	})
	a.wg.Wait()
	a.stacks.Close()
	return nil
}

// track registers c to be closed by Close; false if the agent is closed
// (and c closed).
func (a *Agent) track(c io.Closer) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		c.Close()
		return false
	}
	a.conns[c] = struct{}{}
	return true
}

func (a *Agent) untrack(c io.Closer) {
	a.mu.Lock()
	delete(a.conns, c)
	a.mu.Unlock()
}

func (a *Agent) serveChannels() {
	defer a.wg.Done()
	var id uint64
	backoff := netconn.AcceptBackoff{Log: a.log}
	for {
		c, err := a.ln.AcceptUnix()
		if err != nil {
			if backoff.Wait(err, a.ctx.Done()) {
				continue
			}
			return
		}
		backoff.Reset()
		id++
		a.mu.Lock()
		full := a.channels >= maxChannels
		if !full {
			a.channels++
		}
		a.mu.Unlock()
		if full {
			a.log.Warn("too many shim channels; closing one", "max", maxChannels)
			c.Close()
			continue
		}
		a.wg.Add(1)
		go func(id uint64) {
			defer a.wg.Done()
			defer func() {
				a.mu.Lock()
				a.channels--
				a.mu.Unlock()
			}()
			a.serveChannel(c, id)
		}(id)
	}
}

// serveChannel answers one shim channel's requests, one at a time.
func (a *Agent) serveChannel(uc *net.UnixConn, id uint64) {
	// The socket's name is listed in /proc/net/unix for anyone to see.
	// Served: processes of the agent's own user, who could read the
	// token anyway, and the program's processes that became another
	// user: descendants of the agent's process (vlink exec is their
	// subreaper) whose hello shows the token (checked with the hello).
	uid, pid, err := peerCred(uc)
	if err != nil {
		a.log.Warn("shim channel", "err", err)
		uc.Close()
		return
	}
	member := uid == a.uid
	if !member && !descendsFrom(pid, a.pid) {
		a.log.Warn("refused a shim channel from a process outside the program", "uid", uid, "pid", pid)
		uc.Close()
		return
	}
	c, err := newChanConn(uc)
	if err != nil {
		a.log.Warn("shim channel", "err", err)
		uc.Close()
		return
	}
	defer c.release()
	if !a.track(c) {
		return
	}
	defer func() {
		a.untrack(c)
		c.Close()
	}()
	var buf [headerSize + maxBody]byte
	var out []byte
	for {
		t, body, err := readFrame(c, &buf)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				a.log.Warn("shim channel", "pid", pid, "err", err)
			}
			return
		}
		req, err := parseRequest(t, body)
		if err != nil {
			a.log.Warn("shim channel", "pid", pid, "err", err)
			return
		}
		if !member {
			// Another user's process of the program's tree: its hello
			// must show the token before anything else.
			if req.typ != msgHello || subtle.ConstantTimeCompare(req.token[:], a.token[:]) != 1 {
				a.log.Warn("refused a shim channel from another user: no agent token", "uid", uid, "pid", pid)
				return
			}
			member = true
		}
		out = out[:0]
		switch req.typ {
		case msgHello:
			out = a.welcome(out)
		case msgConnect:
			if err := a.connect(c, id, pid, &req.connect); err != nil {
				a.log.Debug("shim channel", "pid", pid, "err", err)
				return
			}
			continue
		case msgAttach:
			a.attach(id, req.attach)
			continue
		case msgResolve:
			out = a.resolve(out, pid, req.resolve)
		case msgPeer:
			out = a.peer(out, req.addr)
		case msgWhy:
			out = appendFrame(out, msgErrno, binary.BigEndian.AppendUint16(nil, uint16(a.why(req.why))))
		case msgListen:
			out = appendFrame(out, msgErrno, binary.BigEndian.AppendUint16(nil, uint16(a.listen(req.listen))))
		case msgAccepted:
			if err := a.accepted(c, req.addr); err != nil {
				return
			}
			continue
		case msgAnswer:
			out = appendFrame(out, msgErrno, binary.BigEndian.AppendUint16(nil, uint16(a.answered(pid, &req.answer))))
		case msgDatagram:
			if err := writeResult(c, a.datagram(pid, &req.dgram)); err != nil {
				return
			}
			continue
		case msgAddrName:
			name, ok := a.fakes.nameOf(req.addr.Addr())
			body := []byte{0}
			if ok {
				body = append([]byte{1}, name...)
			}
			out = appendFrame(out, msgNameOf, body)
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

func (a *Agent) welcome(b []byte) []byte {
	w := welcome{
		relay4:    uint16(a.relay4.Addr().(*net.TCPAddr).Port),
		timeoutMs: uint32(a.timeout / time.Millisecond),
		fake4:     FakeIPv4,
		fake6:     FakeIPv6,
	}
	if a.relay6 != nil {
		w.relay6 = uint16(a.relay6.Addr().(*net.TCPAddr).Port)
	}
	w.held4 = uint16(a.held4.Addr().(*net.TCPAddr).Port)
	if a.held6 != nil {
		w.held6 = uint16(a.held6.Addr().(*net.TCPAddr).Port)
	}
	if a.router.ipsDirect {
		w.flags |= welcomeIPsDirect
	}
	table := a.router.table
	if a.router.ipsDirect {
		table = nil // the flag says it all
	}
	if table != nil {
		w.flags |= welcomeIPTable
	}
	if a.serve != nil && len(a.serve.Ports) > 0 {
		w.flags |= welcomeServed
	}
	b = appendFrame(b, msgWelcome, w.append(nil))
	if table != nil {
		b = appendFrame(b, msgIPTable, table)
	}
	if w.flags&welcomeServed != 0 {
		b = appendFrame(b, msgServed, appendServed(nil, a.serve.Ports))
	}
	return b
}

func (a *Agent) resolve(b []byte, pid int, req resolveReq) []byte {
	reply := nameReply{kind: nameNone}
	families := vlink.FamilyIPv4 | vlink.FamilyIPv6
	if name, ok := normalizeName(req.name); ok {
		switch {
		case !a.router.nameRouted(name, req.port):
			reply.kind = nameLocal
		case a.ask:
			families = a.lookup(name, req.port)
			if families != 0 {
				reply.kind = nameFake
			}
		default:
			reply.kind = nameFake
		}
		if reply.kind == nameFake {
			v4, v6 := fakeAddrs(a.fakes.lookup(name))
			// A family the name lacks gets no stand-in (all zeros):
			// a program that asks for any family then connects with
			// one the far side has.
			if families&vlink.FamilyIPv4 != 0 {
				reply.v4 = v4
			}
			if families&vlink.FamilyIPv6 != 0 {
				reply.v6 = v6
			}
		}
	}
	a.log.Debug("resolve", "pid", pid, "name", req.name, "port", req.port, "answer",
		[...]string{nameLocal: "local", nameFake: "far side", nameNone: "no such name"}[reply.kind], "families", families.String())
	return appendFrame(b, msgName, reply.append(nil))
}

// lookup asks the far side whether name exists, and with which address
// families (0: it does not). An answer is cached; when the far side
// cannot answer (no gateway that looks up, a best-effort route, an older
// vlink serve), both families come back, as stand-ins always did.
func (a *Agent) lookup(name string, port uint16) vlink.Families {
	if _, _, node := vlink.SplitNodeAddr(net.JoinHostPort(name, "1")); node {
		return vlink.FamilyIPv4 | vlink.FamilyIPv6 // a node's name is no DNS name
	}
	k := lookupKey{name, port}
	if f, ok := a.lookups.get(k, time.Now()); ok {
		return f
	}
	ctx, cancel := context.WithTimeout(a.ctx, min(a.timeout, maxLookupWait))
	defer cancel()
	f, err := a.stacks.LookupHost(ctx, net.JoinHostPort(name, strconv.Itoa(int(port))))
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		f = 0
	case err != nil:
		a.log.Debug("cannot ask the far side about a name; answering with stand-ins", "name", name, "err", err)
		return vlink.FamilyIPv4 | vlink.FamilyIPv6 // not cached: the far side may answer next time
	}
	a.lookups.put(k, f, time.Now())
	return f
}

func (a *Agent) peer(b []byte, local sockAddr) []byte {
	key := netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	// The attach of a connection made just before an exec travels on
	// another channel and may not have been read yet: give it a moment.
	var dest sockAddr
	ok := false
	for deadline := time.Now().Add(peerWait); ; time.Sleep(2 * time.Millisecond) {
		a.mu.Lock()
		dest, ok = a.peers[key]
		a.mu.Unlock()
		if ok || time.Now().After(deadline) {
			break
		}
	}
	body := []byte{0}
	if ok {
		body = appendAddr([]byte{1}, dest)
	} else {
		body = append(body, make([]byte, addrSize)...)
	}
	return appendFrame(b, msgPeerAddr, body)
}

func writeResult(c *chanConn, r result) error {
	_, err := c.Write(appendFrame(nil, msgResult, r.append(nil)))
	return err
}

// verdict applies the rules to a connect's destination: the answer to give
// at once (a refusal, direct), or the decision to dial target by, with
// the attributes to log it with.
func (a *Agent) verdict(pid int, dest sockAddr) (d decision, target string, attrs []any, answer *result) {
	host, fake := dest.Addr().String(), false
	if name, ok := a.fakes.nameOf(dest.Addr()); ok {
		host, fake = name, true
	}
	target = net.JoinHostPort(host, strconv.Itoa(int(dest.Port())))
	d, err := a.router.decide(target)
	attrs = []any{"pid", pid, "to", target}
	if err != nil {
		a.observed(ConnectFailed)
		a.log.Info("cannot route", append(attrs, "err", err)...)
		return d, target, attrs, &result{kind: resultError, errno: uint16(syscall.EINVAL)}
	}
	cache := uint8(0)
	if !fake {
		cache = resultFlagCache // the rules are fixed, and so is the verdict for an address
	}
	switch d.rule.Action {
	case selector.Refuse:
		a.observed(ConnectRefused)
		a.log.Info("refused by the rules", attrs...)
		return d, target, attrs, &result{kind: resultError, flags: cache, errno: uint16(syscall.EPERM)}
	case selector.Direct:
		if !fake {
			a.observed(ConnectDirect)
			a.log.Debug("direct", attrs...)
			return d, target, attrs, &result{kind: resultDirect, flags: cache}
		}
	}
	switch d.rule.Action {
	case selector.Stack:
		attrs = append(attrs, "stack", d.stack.String(), "via", d.rule.Via)
	case selector.BestEffort:
		ways := make([]string, len(d.rule.Try))
		for i, w := range d.rule.Try {
			ways[i] = secret.RedactStack(w) // a proxy URL's password, say
		}
		attrs = append(attrs, "stack", "best effort: "+strings.Join(ways, " | "))
	default:
		attrs = append(attrs, "stack", "direct")
	}
	return d, target, attrs, nil
}

// connect decides a connect and answers it. A failure to answer is the
// channel's end.
func (a *Agent) connect(c *chanConn, channel uint64, pid int, req *connectReq) error {
	d, target, attrs, answer := a.verdict(pid, req.dest)
	if answer != nil {
		return writeResult(c, *answer)
	}
	// A route that is the destination itself with options (a real
	// address: a fake one's target is its name) is the same connect
	// every time: the shim may make it as the program's own.
	pf, to := plainFactory(d, target, req.family)
	var direct *recipe
	if pf != nil && to == req.dest {
		direct = &recipe{gateway: req.dest, opts: recipeOpts(pf)}
	}
	if direct != nil && req.own && req.mode == modeAsync {
		// The socket can take the options and connect itself: held and
		// relayed, it would have the agent in its data path. (A
		// blocking connect is faster to its first byte the agent's
		// way, below: the target's answer overlaps the descriptor's
		// passing.)
		if body, ok := direct.append(nil); ok {
			a.observed(ConnectRouted)
			a.log.Debug("direct, with the route's options", attrs...)
			_, err := c.Write(append(appendFrame(nil, msgResult, (&result{kind: resultDirect, flags: resultFlagRecipe}).append(nil)),
				appendFrame(nil, msgRecipe, body)...))
			return err
		}
	}
	timeout := a.timeout
	if t := time.Duration(req.timeoutMs) * time.Millisecond; t > 0 && t < timeout {
		timeout = t
	}
	dial := func() (net.Conn, error) {
		ctx, cancel := context.WithTimeout(a.ctx, timeout)
		defer cancel()
		return a.dial(ctx, d, target)
	}
	if req.mode == modeAsync {
		p := a.newPending(channel, req.dest, true)
		if err := writeResult(c, result{kind: resultRelay, token: p.token}); err != nil {
			a.dropPending(p)
			return err
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			conn, err := dial()
			a.finishHeld(p, conn, err, attrs)
		}()
		return nil
	}
	if pf != nil {
		// With the descriptor, direct (if any) for the next connects.
		return a.connectPlain(c, func() (int, error) { return dialPlain(a.ctx, pf, to, timeout) }, attrs, direct)
	}
	if f, gw := a.gatewayFactory(d, req.family); f != nil {
		// A blocking connect with no timeout of its own to a real
		// address is the same every time: the shim may make the next
		// ones itself.
		var rec *recipe
		if _, fake := a.fakes.nameOf(req.dest.Addr()); !fake && req.timeoutMs == 0 {
			rec = new(recipe)
		}
		return a.connectPlain(c, func() (int, error) { return dialGateway(a.ctx, f, gw, target, timeout, rec) }, attrs, rec)
	}
	conn, err := dial()
	if err != nil {
		a.observed(ConnectFailed)
		a.log.Info("cannot connect", append(attrs, "err", err)...)
		return writeResult(c, result{kind: resultError, errno: uint16(errnoOf(err))})
	}
	a.observed(ConnectRouted)
	if tc := plainTCP(conn); tc != nil && socketFamily(tc) == req.family {
		// Plain TCP after the stack's handshake: the program gets the
		// socket itself, and the agent is out of the data path.
		err := sendFD(c, appendFrame(nil, msgResult, (&result{kind: resultFD}).append(nil)), tc)
		conn.Close()
		a.log.Debug("passed a descriptor", attrs...)
		return err
	}
	p := a.newPending(channel, req.dest, false)
	if err := writeResult(c, result{kind: resultRelay, token: p.token}); err != nil {
		a.dropPending(p)
		conn.Close()
		return err
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.finish(p, conn, attrs)
	}()
	return nil
}

// connectPlain answers a blocking connect whose route is plain TCP, to
// the target or to a gateway that takes a hello with no key
// (plainFactory, gatewayFactory): the agent connects on this thread with
// dial and passes the program the socket, and with it rec, if dial
// wrote one there.
func (a *Agent) connectPlain(c *chanConn, dial func() (int, error), attrs []any, rec *recipe) error {
	fd, err := dial()
	if err != nil {
		a.observed(ConnectFailed)
		a.log.Info("cannot connect", append(attrs, "err", err)...)
		return writeResult(c, result{kind: resultError, errno: uint16(errnoOf(err))})
	}
	a.observed(ConnectRouted)
	res := result{kind: resultFD}
	var more []byte
	if rec != nil {
		if body, ok := rec.append(nil); ok {
			res.flags = resultFlagRecipe
			more = appendFrame(nil, msgRecipe, body)
		}
	}
	err = c.writeWithFD(append(appendFrame(nil, msgResult, res.append(nil)), more...), fd)
	unix.Close(fd)
	a.log.Debug("passed a descriptor", append(attrs, "recipe", more != nil)...)
	return err
}

// answered tells the shim the errno of what a recipe's gateway answered
// instead of its accept (msgAnswer): the refusal's, ETIMEDOUT when the
// wait ran out, or 0 for an answer that is no refusal (the shim then asks
// for the connect).
func (a *Agent) answered(pid int, m *answerReq) syscall.Errno {
	attrs := []any{"pid", pid, "to", m.dest.String(), "recipe", true}
	err := os.ErrDeadlineExceeded
	if !m.timedOut {
		// The hello's text does not change how an answer reads without
		// a key: any hello of PlainHello's will do.
		hello := vlink.PlainHello(context.Background(), m.dest.String(), "")
		if err = vlink.ReadPlainAnswer(bytes.NewReader(m.bytes()), hello); err == nil {
			return 0
		}
	}
	a.observed(ConnectFailed)
	a.log.Info("cannot connect", append(attrs, "err", err)...)
	return errnoOf(err)
}

// dial connects to target as decision d says.
func (a *Agent) dial(ctx context.Context, d decision, target string) (net.Conn, error) {
	if d.rule.Action == selector.Direct {
		// A far-side name whose rule says direct: the agent resolves it.
		return a.direct.DialContext(ctx, "tcp", target)
	}
	c, err := a.stacks.DialContext(ctx, "tcp", target)
	if err == nil && d.rule.Action == selector.BestEffort {
		a.log.Debug("best effort", "to", target, "way", vlink.PathOf(c))
	}
	return c, err
}

// plainTCP returns the TCP connection under c if c passes bytes to it
// unchanged (netconn.Unwrapper: a plain stack after its hello, a
// best-effort route's direct way), or nil.
func plainTCP(c net.Conn) *net.TCPConn {
	for {
		switch w := c.(type) {
		case *net.TCPConn:
			return w
		case netconn.Unwrapper:
			c = w.UnwrapConn()
		default:
			return nil
		}
	}
}

func (a *Agent) newPending(channel uint64, dest sockAddr, held bool) *pending {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.nextToken++
	p := &pending{token: a.nextToken, channel: channel, dest: dest, held: held}
	if held {
		p.at = make(chan netip.AddrPort, 1)
	} else {
		p.prog = make(chan net.Conn, 1)
	}
	a.pending[p.token] = p
	return p
}

func (a *Agent) dropPending(p *pending) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.pending, p.token)
	if p.local.IsValid() && a.byLocal[p.local] == p {
		delete(a.byLocal, p.local)
	}
}

// attach joins a token with the address its relay connection comes from.
func (a *Agent) attach(channel uint64, m attachReq) {
	local := netip.AddrPortFrom(m.local.Addr().Unmap(), m.local.Port())
	a.mu.Lock()
	defer a.mu.Unlock()
	p, ok := a.pending[m.token]
	if !ok || p.channel != channel || p.local.IsValid() {
		return
	}
	p.local = local
	a.peers[local] = p.dest
	if p.held {
		p.at <- local
		return
	}
	if o, ok := a.orphans[local]; ok {
		o.timer.Stop()
		delete(a.orphans, local)
		p.prog <- o.c
		return
	}
	a.byLocal[local] = p
}

// serveRelays accepts the programs' relay connections.
func (a *Agent) serveRelays(l *net.TCPListener) {
	defer a.wg.Done()
	backoff := netconn.AcceptBackoff{Log: a.log}
	for {
		c, err := l.AcceptTCP()
		if err != nil {
			if backoff.Wait(err, a.ctx.Done()) {
				continue
			}
			return
		}
		backoff.Reset()
		from := c.RemoteAddr().(*net.TCPAddr).AddrPort()
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		a.mu.Lock()
		if p, ok := a.byLocal[from]; ok {
			delete(a.byLocal, from)
			p.prog <- c
		} else if len(a.orphans) < maxOrphans && !a.closed {
			a.orphans[from] = orphan{c: c, timer: time.AfterFunc(attachTimeout, func() {
				a.mu.Lock()
				if a.orphans[from].c == c {
					delete(a.orphans, from)
					c.Close()
				}
				a.mu.Unlock()
			})}
		} else {
			c.Close()
		}
		a.mu.Unlock()
	}
}

// observed tells AgentConfig.Observe how a connect was answered.
func (a *Agent) observed(o ConnectOutcome) {
	if a.observe != nil {
		a.observe(o)
	}
}

// finish joins a blocking connect's dialed connection with the program's
// relay connection and relays until both ends are done.
func (a *Agent) finish(p *pending, conn net.Conn, attrs []any) {
	defer a.forgetPeer(p)
	prog := await(a, p.prog)
	a.dropPending(p)
	if prog == nil {
		conn.Close()
		a.log.Info("the program's relay connection never came", attrs...)
		return
	}
	a.relay(prog, conn, attrs)
}

// await returns what ch brings within attachTimeout, or the zero value if
// nothing came or the agent closed.
func await[T any](a *Agent, ch <-chan T) (v T) {
	timer := time.NewTimer(attachTimeout)
	defer timer.Stop()
	select {
	case v = <-ch:
	case <-timer.C:
	case <-a.ctx.Done():
	}
	return v
}

// forgetPeer drops what getpeername answers for p's program socket.
func (a *Agent) forgetPeer(p *pending) {
	a.mu.Lock()
	if p.local.IsValid() && a.peers[p.local] == p.dest {
		delete(a.peers, p.local)
	}
	a.mu.Unlock()
}

// finishHeld completes a non-blocking connect held in SYN-SENT
// (held_linux.go): released into a relay once the dial succeeded, or
// reset, with the dial's errno kept for the shim to ask.
func (a *Agent) finishHeld(p *pending, conn net.Conn, err error, attrs []any) {
	defer a.forgetPeer(p)
	local := await(a, p.at)
	a.dropPending(p)
	if err != nil {
		a.observed(ConnectFailed)
		a.log.Info("cannot connect", append(attrs, "err", err)...)
		if local.IsValid() {
			a.fail(p.token, errnoOf(err))
			if prog, err := a.release(local, true); err == nil {
				prog.SetLinger(0)
				prog.Close()
			}
		}
		return
	}
	a.observed(ConnectRouted)
	if !local.IsValid() {
		conn.Close()
		a.log.Info("the program's connect never came", attrs...)
		return
	}
	prog, err := a.release(local, false)
	if err != nil {
		conn.Close()
		a.log.Info("the program's socket left before its connect completed", append(attrs, "err", err)...)
		return
	}
	a.relay(prog, conn, attrs)
}

// release connects to the program's held socket at local (see release in
// held_linux.go).
func (a *Agent) release(local netip.AddrPort, fail bool) (*net.TCPConn, error) {
	held := a.held4
	if local.Addr().Is6() {
		held = a.held6
	}
	if held == nil {
		return nil, fmt.Errorf("preload: no held listener for %v", local)
	}
	// Not a.ctx: a closing agent still wakes the held sockets, with a
	// reset, rather than leave them to their SYN's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	return release(ctx, held, local, fail)
}

// fail keeps a held connect's errno until the shim asks (why).
func (a *Agent) fail(token uint64, errno syscall.Errno) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.failed) >= maxFailed {
		for t, f := range a.failed {
			if now.Sub(f.at) > failedKeep {
				delete(a.failed, t)
			}
		}
		if len(a.failed) >= maxFailed {
			return // the shim reports the reset itself
		}
	}
	a.failed[token] = failure{errno: errno, at: now}
}

// why returns and forgets the errno of a held connect that failed, or 0.
func (a *Agent) why(token uint64) syscall.Errno {
	a.mu.Lock()
	defer a.mu.Unlock()
	f := a.failed[token]
	delete(a.failed, token)
	return f.errno
}

// relay carries bytes between the program's connection and the dialed one
// until both ends are done.
func (a *Agent) relay(prog, conn net.Conn, attrs []any) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		prog.Close()
		conn.Close()
		return
	}
	a.conns[prog] = struct{}{}
	a.conns[conn] = struct{}{}
	a.relaying++
	a.mu.Unlock()
	a.log.Debug("relaying", attrs...)
	up, down, rerr := netconn.Relay(prog, conn)
	a.untrack(prog)
	a.untrack(conn)
	a.mu.Lock()
	if a.relaying--; a.relaying == 0 && a.drained != nil {
		close(a.drained)
		a.drained = nil
	}
	a.mu.Unlock()
	if rerr != nil && !errors.Is(rerr, net.ErrClosed) {
		// The program sees the failure itself; say it only at debug.
		a.log.Debug("relay failed", append(attrs, "bytes_up", up, "bytes_down", down, "err", rerr)...)
		return
	}
	a.log.Debug("relay done", append(attrs, "bytes_up", up, "bytes_down", down)...)
}

// errnoOf maps a dial error to the errno a program's connect returns.
func errnoOf(err error) syscall.Errno {
	// The dial's own errno, or the one a gateway's refusal carries (the
	// failure of its dial to the target: vlink.TargetRefusal).
	for _, en := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH,
		syscall.ECONNRESET, syscall.EACCES, syscall.EPERM, syscall.EADDRNOTAVAIL, syscall.ENETDOWN,
		syscall.EHOSTDOWN} {
		if errors.Is(err, en) {
			return en
		}
	}
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return syscall.ETIMEDOUT
	case errors.Is(err, vlink.ErrDirectRefused):
		return syscall.EPERM
	case errors.Is(err, vlink.ErrAuth), errors.Is(err, vlink.ErrNotAllowed):
		// The gateway's policy refused us: permission, not the network.
		return syscall.EACCES
	case errors.As(err, &dnsErr):
		return syscall.EHOSTUNREACH
	}
	// A refusal from a gateway older than the errno-carrying codes, or
	// of another kind: a refusal is what the program can act on best.
	return syscall.ECONNREFUSED
}
