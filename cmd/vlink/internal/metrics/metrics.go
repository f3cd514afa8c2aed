// Package metrics is the --metrics endpoint of vlink's serving commands:
// Prometheus counters of connections, bytes, refusals and handshakes,
// with the layers' own counters (compress, mux, parallel streams)
// beside them. Only the command imports client_golang: the layers keep
// plain atomic counters, which the collector here reads at each scrape.
package metrics

import (
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// maxStackLabels bounds the values of the stack label: a listener
// mirrors what its dialers ask for, and the combinations of layers must
// not grow the metrics without bound. Stacks past it count as "other".
// maxForwardLabels bounds the forward label's the same way: forwards come
// and go with reloads of the --forwards file.
const (
	maxStackLabels   = 32
	maxForwardLabels = 256
)

// Labels name the connections of a relay: its forward (its name in the
// --forwards file, else its listen address as written), its
// stack (StackLabel), and the transport it took (Transport). Every
// value comes from the configuration or a bounded set, never from the
// network.
type Labels struct {
	Forward, Stack, Transport string
}

// relayLabels are the label names of a relay's series, in order.
var relayLabels = []string{"forward", "stack", "transport"}

// values returns l's label values, bounded.
func (m *Metrics) values(l Labels, more ...string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := l.Transport
	if t == "" {
		t = TransportNone
	}
	return append([]string{bound(m.forwards, maxForwardLabels, l.Forward), bound(m.stacks, maxStackLabels, l.Stack), t}, more...)
}

// bound gives value out until seen holds max values, then "other".
func bound(seen map[string]bool, max int, value string) string {
	if seen[value] {
		return value
	}
	if len(seen) >= max {
		return "other"
	}
	seen[value] = true
	return value
}

// A Metrics is what --Metrics serves: Prometheus Metrics of the
// connections a command carries. A nil *Metrics counts nothing, so the
// commands call it whether or not --Metrics was given.
type Metrics struct {
	Reg       *prometheus.Registry
	open      *prometheus.GaugeVec     // relayLabels
	conns     *prometheus.CounterVec   // relayLabels, outcome
	refusals  *prometheus.CounterVec   // reason
	handshake *prometheus.HistogramVec // outcome: ok, or the refusal's reason; stack
	dial      *prometheus.HistogramVec // relayLabels
	connects  *prometheus.CounterVec   // outcome: vlink exec's agent
	reloadOK  prometheus.Gauge         // --forwards: the last reading of the file
	reloadAt  prometheus.Gauge

	mu       sync.Mutex
	stacks   map[string]bool // the stack labels given out
	claimed  map[string]bool // those given out for failed handshakes' claims only
	forwards map[string]bool // the forward labels given out
	reloads  bool            // the reload metrics are registered

	srcMu   sync.Mutex
	sources []ByteSource // vlink_bytes_total's
}

// A ByteSource reports, each time it is called, the application bytes
// its relays carried so far, by their labels, up and down: those that
// ended and, as far as the kernel has counted them, those in progress.
// Each figure only ever grows, so that vlink_bytes_total, their sum, is
// a counter.
type ByteSource func(yield func(l Labels, up, down uint64))

// AddBytes counts src's bytes in vlink_bytes_total, for the rest of the
// process: a source's bytes stay counted after its relays are gone.
func (m *Metrics) AddBytes(src ByteSource) {
	if m == nil {
		return
	}
	m.srcMu.Lock()
	m.sources = append(m.sources, src)
	m.srcMu.Unlock()
}

var bytesDesc = prometheus.NewDesc("vlink_bytes_total",
	"Application bytes relayed, by forward, stack, transport and direction (up: from the client toward the destination, down: back): "+
		"as they cross, read from the kernel's counts at each scrape, for a relay whose client or target is a TCP socket of its own; "+
		"as each connection ends for the rest (datagram sessions).",
	append(relayLabels[:len(relayLabels):len(relayLabels)], "direction"), nil)

// bytesCollector sums the ByteSources at each scrape.
type bytesCollector struct{ m *Metrics }

func (c bytesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- bytesDesc }

func (c bytesCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.srcMu.Lock()
	sources := c.m.sources
	c.m.srcMu.Unlock()
	sums := map[[3]string]*[2]uint64{}
	for _, src := range sources {
		src(func(l Labels, up, down uint64) {
			k := [3]string(c.m.values(l))
			if sums[k] == nil {
				sums[k] = new([2]uint64)
			}
			sums[k][0] += up
			sums[k][1] += down
		})
	}
	for k, v := range sums {
		ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.CounterValue, float64(v[0]), append(k[:], "up")...)
		ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.CounterValue, float64(v[1]), append(k[:], "down")...)
	}
}

// Outcomes of a connection (the outcome label).
const (
	OutcomeOK          = "ok"          // both directions ended
	OutcomeFailed      = "failed"      // a direction failed; both were reset
	OutcomeIdle        = "idle"        // reset after --idle-timeout
	OutcomeCut         = "cut"         // cut at shutdown, the grace period over
	outcomeUnreachable = "unreachable" // the destination could not be reached
)

func newMetrics() *Metrics {
	m := &Metrics{
		Reg:      prometheus.NewRegistry(),
		stacks:   map[string]bool{},
		claimed:  map[string]bool{},
		forwards: map[string]bool{},
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vlink_connections_open",
			Help: "Connections being relayed, by forward, stack and transport.",
		}, relayLabels),
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vlink_connections_total",
			Help: "Connections relayed or attempted, by forward, stack, transport (none for a destination not reached) and outcome (ok, failed, idle, cut, unreachable).",
		}, append(relayLabels[:len(relayLabels):len(relayLabels)], "outcome")),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vlink_refusals_total",
			Help: "Accepted connections refused, or whose handshake (VLink or SOCKS) failed, by reason.",
		}, []string{"reason"}),
		handshake: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vlink_handshake_duration_seconds",
			Help:    "Time from accepting a connection to being ready to relay it (its VLink or SOCKS handshake, reaching the destination included), or to its refusal, by outcome (ok, or the reason as vlink_refusals_total gives it: a handshake that timed out shows how long the peer held a slot) and stack (the hello's, as claimed when it failed; plain for a plain client, none before a hello or for SOCKS, member for a connection a multi-link layer took into its session).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10), // 100 µs to 26 s
		}, []string{"outcome", "stack"}),
		dial: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vlink_dial_duration_seconds",
			Help:    "Time to reach a destination through a stack, handshakes included, of the dials that succeeded, by forward, stack and transport.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, relayLabels),
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vlink_exec_connects_total",
			Help: "The program's connects that vlink exec's agent answered, by outcome: routed (through a stack), direct, refused (by the rules), failed (the stack did not reach the destination). Connects to IP addresses the shim decides itself from the rules, direct or refused, are not asked about and not counted, nor are the connects on a tcp route that the shim makes itself from a recipe once the agent answered one: the blocking ones through its gateway unless they fail, and all of those of a route with no gateway.",
		}, []string{"outcome"}),
	}
	m.reloadOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vlink_config_last_reload_successful",
		Help: "Whether the last reading of the forwards (at the start, or on SIGHUP: the --forwards file, or the command line's forward's key files and routing configuration) applied them whole: 1, or 0 when it was refused or some forwards could not start.",
	})
	m.reloadAt = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vlink_config_last_reload_success_timestamp_seconds",
		Help: "When the forwards were last applied whole, in seconds since the epoch.",
	})
	m.Reg.MustRegister(m.open, m.conns, bytesCollector{m}, m.refusals, m.handshake, m.dial, m.connects, layerCollector{}, buildInfo(),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector())
	return m
}

// FlagVar defines --metrics.
func FlagVar(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "metrics", "", "serve Prometheus metrics on http://`ADDR`/metrics (host:port, e.g. 127.0.0.1:9464): connections open and done and bytes as they cross, by forward (the listener), stack and transport (tcp, shm, quic...), refusals by reason, handshake and dial latency, vlink exec's connects by outcome, the build and the last --forwards reload, and the layers' own figures: compression bytes each way, the adaptive layer's settings, mux and parallel sessions and streams; and /healthz for probes (default: none)")
}

// Serve serves m on addr until the returned stop is called; with
// an empty addr it returns a nil *metrics.
func Serve(ctx context.Context, e *base.Env, addr string) (*Metrics, func(), error) {
	if addr == "" {
		return nil, func() {}, nil
	}
	if err := base.CheckHostPort(addr); err != nil {
		return nil, nil, base.Usagef("--metrics %v", err)
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	m := newMetrics()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Reg, promhttp.HandlerOpts{}))
	// For a load balancer's or an orchestrator's probe: the process is
	// up and serves (its listeners were opened before this one).
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	e.Log.Info("serving metrics", "addr", "http://"+l.Addr().String()+"/metrics")
	return m, func() { srv.Close() }, nil
}

// StackLabel names a stack as its hello does, by the layers both ends
// run, without their parameters or the factory below them:
// zstd:level=3+tcp is zstd, on the tunnel's side as on serve's; plain
// when there are none.
func StackLabel(s vlink.Stack) string {
	var names []string
	for _, l := range s.Layers {
		if spec, ok := layer.Lookup(l.Name); ok && !spec.Kind.Mirrored() {
			break // a route layer or a factory: the rest is below the ends
		}
		names = append(names, l.Name)
	}
	if len(names) == 0 {
		return "plain"
	}
	return strings.Join(names, "+")
}

// HelloStackLabel is the stack label of a connection a listener
// accepted with hello h: what the dialer stacked, the layers a
// multi-link layer's session adds below the connection's own included
// (Hello.Session), as the dialer's StackLabel spells it.
func HelloStackLabel(h *vlink.Hello) string {
	return StackLabel(vlink.Stack{Layers: slices.Concat(h.Stack.Layers, h.Session.Layers)})
}

// Transports (the transport label): what a connection's bytes took
// below its stack.
const (
	TransportTCP  = "tcp"
	TransportShm  = "shm"  // shared memory with a process of this machine
	TransportQUIC = "quic" // a stream of a QUIC connection
	TransportUDP  = "udp"  // a UDP socket: datagrams as they came
	TransportNode = "node" // a connection to a node of a vlink network, by whatever path it found
	TransportUnix = "unix"
	// TransportNone: no connection was made (a dial that failed).
	TransportNone = "none"
)

// Transport names what c runs over, from its local address: the
// network of the connection at the bottom of its layers.
func Transport(c net.Conn) string {
	if c == nil || c.LocalAddr() == nil {
		return "other"
	}
	switch n := c.LocalAddr().Network(); n {
	case "tcp", "tcp4", "tcp6":
		return TransportTCP
	case "shm":
		return TransportShm
	case "udp", "udp4", "udp6":
		if _, ok := c.(*net.UDPConn); ok {
			return TransportUDP
		}
		return TransportQUIC // a stream over UDP
	case "vlink":
		return TransportNode
	case "unix":
		return TransportUnix
	}
	return "other"
}

// RelayStarted counts a connection being relayed.
func (m *Metrics) RelayStarted(l Labels) {
	if m == nil {
		return
	}
	m.open.WithLabelValues(m.values(l)...).Inc()
}

// Reloaded records a reading of the --forwards file: applied whole (ok),
// or not. The first call registers the reload metrics.
func (m *Metrics) Reloaded(ok bool) {
	if m == nil {
		return
	}
	m.mu.Lock()
	if !m.reloads {
		m.reloads = true
		m.Reg.MustRegister(m.reloadOK, m.reloadAt)
	}
	m.mu.Unlock()
	if !ok {
		m.reloadOK.Set(0)
		return
	}
	m.reloadOK.Set(1)
	m.reloadAt.SetToCurrentTime()
}

// buildInfo is vlink_build_info: vlink's version, revision and Go's.
func buildInfo() prometheus.Collector {
	version, revision := "(devel)", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				revision = s.Value[:min(12, len(s.Value))]
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "vlink_build_info",
		Help:        "Always 1: the vlink build serving these metrics, in its labels.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}

// RelayEnded counts a relay's end; its bytes are its ByteSource's.
func (m *Metrics) RelayEnded(l Labels, outcome string) {
	if m == nil {
		return
	}
	v := m.values(l)
	m.open.WithLabelValues(v...).Dec()
	m.conns.WithLabelValues(append(v, outcome)...).Inc()
}

// Dialed counts a dial that took took and failed with err (nil:
// succeeded, over l.Transport). A dial cancelled by shutdown counts as
// nothing.
func (m *Metrics) Dialed(l Labels, took time.Duration, err error) {
	switch {
	case m == nil || errors.Is(err, context.Canceled):
	case err != nil:
		l.Transport = TransportNone
		m.conns.WithLabelValues(append(m.values(l), outcomeUnreachable)...).Inc()
	default:
		m.dial.WithLabelValues(m.values(l)...).Observe(took.Seconds())
	}
}

// Connected counts a program's connect under vlink exec, answered as
// outcome says.
func (m *Metrics) Connected(outcome string) {
	if m != nil {
		m.connects.WithLabelValues(outcome).Inc()
	}
}

// Refused counts a connection Refused for reason.
func (m *Metrics) Refused(reason string) {
	if m != nil {
		m.refusals.WithLabelValues(reason).Inc()
	}
}

// Stack labels of handshakes that ran no VLink stack.
const (
	StackNone = "none" // no hello was read: a SOCKS handshake, or one that failed before its hello
	// stackInvalid: a failed hello's stack that does not parse.
	stackInvalid = "invalid"
	// stackMember: a connection a multi-link layer (mux, parallel) took
	// over as a member of its session; its streams' handshakes count
	// with their own stacks.
	stackMember = "member"
	// maxClaimedLabels bounds the stack labels that only failed
	// handshakes' claims gave out, apart from maxStackLabels, so that
	// hellos nobody proved cannot crowd out the stacks that run.
	maxClaimedLabels = 8
)

// HandshakeDone counts a handshake of stack (a StackLabel, or StackNone)
// that succeeded after took.
func (m *Metrics) HandshakeDone(stack string, took time.Duration) {
	if m != nil {
		m.handshake.WithLabelValues(OutcomeOK, m.stackValue(stack)).Observe(took.Seconds())
	}
}

// HandshakeFailed counts a handshake with no hello (a SOCKS one)
// refused, or failed, for reason after took: a refusal, and its time.
func (m *Metrics) HandshakeFailed(reason string, took time.Duration) {
	if m != nil {
		m.refusals.WithLabelValues(reason).Inc()
		m.handshake.WithLabelValues(reason, StackNone).Observe(took.Seconds())
	}
}

// Handshook is a vlink.ListenConfig.Observe: each handshake's time, by
// outcome and stack, and the failures' reasons.
func (m *Metrics) Handshook(c *vlink.Conn, took time.Duration, err error) {
	if m == nil {
		return
	}
	if err == nil {
		stack := stackMember // a multi-link layer took it over
		if c != nil {
			stack = "plain"
			if h := c.Hello(); h != nil {
				stack = HelloStackLabel(h)
			}
		}
		m.HandshakeDone(stack, took)
		return
	}
	reason := refusalReason(err)
	m.refusals.WithLabelValues(reason).Inc()
	m.handshake.WithLabelValues(reason, m.claimedValue(err)).Observe(took.Seconds())
}

// stackValue is a stack label, bounded.
func (m *Metrics) stackValue(stack string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return bound(m.stacks, maxStackLabels, stack)
}

// claimedValue is the stack label of a handshake that failed with err:
// the one its hello named, as a label the stacks that ran gave out
// already, or else under a bound of its own; StackNone before a hello,
// plain for a plain client refused.
func (m *Metrics) claimedValue(err error) string {
	var he *vlink.HandshakeError
	switch {
	case errors.Is(err, vlink.ErrPlainRefused):
		return "plain"
	case !errors.As(err, &he):
		return StackNone
	}
	label := stackInvalid
	if s, perr := vlink.Parse(he.Stack); perr == nil {
		label = StackLabel(s)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stacks[label] {
		return label
	}
	return bound(m.claimed, maxClaimedLabels, label)
}

// refusalReason is the reason label of a handshake that failed: the
// refusal's code, or what went wrong.
func refusalReason(err error) string {
	var re *vlink.RefusedError
	switch {
	case errors.As(err, &re):
		return strings.ReplaceAll(re.Code.String(), " ", "_")
	case errors.Is(err, vlink.ErrPlainRefused):
		return "plain_refused"
	case errors.Is(err, vlink.ErrShed):
		return "shed"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	}
	return "handshake_failed"
}
