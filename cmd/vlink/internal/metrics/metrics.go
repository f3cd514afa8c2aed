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
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/vlink"
)

// maxStackLabels bounds the values of the stack label: a listener
// mirrors what its dialers ask for, and the combinations of layers must
// not grow the metrics without bound. Stacks past it count as "other".
const maxStackLabels = 32

// A Metrics is what --Metrics serves: Prometheus Metrics of the
// connections a command carries. A nil *Metrics counts nothing, so the
// commands call it whether or not --Metrics was given.
type Metrics struct {
	Reg       *prometheus.Registry
	open      *prometheus.GaugeVec     // stack
	conns     *prometheus.CounterVec   // stack, outcome
	refusals  *prometheus.CounterVec   // reason
	handshake *prometheus.HistogramVec // outcome: ok, or the refusal's reason
	dial      *prometheus.HistogramVec // stack
	connects  *prometheus.CounterVec   // outcome: vlink exec's agent
	reloadOK  prometheus.Gauge         // --forwards: the last reading of the file
	reloadAt  prometheus.Gauge

	mu      sync.Mutex
	stacks  map[string]bool // the stack labels given out
	reloads bool            // the reload metrics are registered

	srcMu   sync.Mutex
	sources []ByteSource // vlink_bytes_total's
}

// A ByteSource reports, each time it is called, the application bytes
// its relays carried so far, by stack, up and down: those that ended
// and, as far as the kernel has counted them, those in progress. Each
// figure only ever grows, so that vlink_bytes_total, their sum, is a
// counter.
type ByteSource func(yield func(stack string, up, down uint64))

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
	"Application bytes relayed, by stack and direction (up: from the client toward the destination, down: back): "+
		"as they cross, read from the kernel's counts at each scrape, for a relay whose client or target is a TCP socket of its own; "+
		"as each connection ends for the rest (datagram sessions).",
	[]string{"stack", "direction"}, nil)

// bytesCollector sums the ByteSources at each scrape.
type bytesCollector struct{ m *Metrics }

func (c bytesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- bytesDesc }

func (c bytesCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.srcMu.Lock()
	sources := c.m.sources
	c.m.srcMu.Unlock()
	sums := map[string]*[2]uint64{}
	for _, src := range sources {
		src(func(stack string, up, down uint64) {
			l := c.m.label(stack)
			if sums[l] == nil {
				sums[l] = new([2]uint64)
			}
			sums[l][0] += up
			sums[l][1] += down
		})
	}
	for stack, v := range sums {
		ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.CounterValue, float64(v[0]), stack, "up")
		ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.CounterValue, float64(v[1]), stack, "down")
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
		Reg:    prometheus.NewRegistry(),
		stacks: map[string]bool{},
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vlink_connections_open",
			Help: "Connections being relayed, by stack.",
		}, []string{"stack"}),
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vlink_connections_total",
			Help: "Connections relayed or attempted, by stack and outcome (ok, failed, idle, cut, unreachable).",
		}, []string{"stack", "outcome"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vlink_refusals_total",
			Help: "Accepted connections refused, or whose handshake (VLink or SOCKS) failed, by reason.",
		}, []string{"reason"}),
		handshake: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vlink_handshake_duration_seconds",
			Help:    "Time from accepting a connection to being ready to relay it (its VLink or SOCKS handshake, reaching the destination included), or to its refusal, by outcome: ok, or the reason as vlink_refusals_total gives it (a handshake that timed out shows how long the peer held a slot).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10), // 100 µs to 26 s
		}, []string{"outcome"}),
		dial: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vlink_dial_duration_seconds",
			Help:    "Time to reach a destination through a stack, handshakes included, of the dials that succeeded.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"stack"}),
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vlink_exec_connects_total",
			Help: "The program's connects that vlink exec's agent answered, by outcome: routed (through a stack), direct, refused (by the rules), failed (the stack did not reach the destination). Connects to IP addresses the shim decides itself from the rules, direct or refused, are not asked about and not counted.",
		}, []string{"outcome"}),
	}
	m.reloadOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vlink_config_last_reload_successful",
		Help: "Whether the last reading of the --forwards file (at the start, or on SIGHUP) applied it whole: 1, or 0 when it was refused or some forwards could not start. Absent without --forwards.",
	})
	m.reloadAt = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vlink_config_last_reload_success_timestamp_seconds",
		Help: "When the --forwards file was last applied whole, in seconds since the epoch.",
	})
	m.handshake.WithLabelValues(OutcomeOK) // served from the start, as the histogram was
	m.Reg.MustRegister(m.open, m.conns, bytesCollector{m}, m.refusals, m.handshake, m.dial, m.connects, layerCollector{}, buildInfo(),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector())
	return m
}

// FlagVar defines --metrics.
func FlagVar(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "metrics", "", "serve Prometheus metrics on http://`ADDR`/metrics (host:port, e.g. 127.0.0.1:9464): connections open and done by stack and outcome, bytes as they cross, refusals by reason, handshake and dial latency, vlink exec's connects by outcome, the build and the last --forwards reload, and the layers' own figures: compression bytes each way, the adaptive layer's settings, mux and parallel sessions and streams; and /healthz for probes (default: none)")
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

// label bounds the stack label's values: the first maxStackLabels stacks
// keep their text, the rest are "other".
func (m *Metrics) label(stack string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stacks[stack] {
		return stack
	}
	if len(m.stacks) >= maxStackLabels {
		return "other"
	}
	m.stacks[stack] = true
	return stack
}

// StackLabel names a stack by its layers, without their parameters:
// zstd:level=3+tcp is zstd+tcp.
func StackLabel(s vlink.Stack) string {
	names := make([]string, len(s.Layers))
	for i, l := range s.Layers {
		names[i] = l.Name
	}
	return strings.Join(names, "+")
}

// RelayStarted counts a connection being relayed through stack.
func (m *Metrics) RelayStarted(stack string) {
	if m == nil {
		return
	}
	m.open.WithLabelValues(m.label(stack)).Inc()
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
func (m *Metrics) RelayEnded(stack, outcome string) {
	if m == nil {
		return
	}
	stack = m.label(stack)
	m.open.WithLabelValues(stack).Dec()
	m.conns.WithLabelValues(stack, outcome).Inc()
}

// Dialed counts a dial through stack that took took and failed with err
// (nil: succeeded). A dial cancelled by shutdown counts as nothing.
func (m *Metrics) Dialed(stack string, took time.Duration, err error) {
	switch {
	case m == nil || errors.Is(err, context.Canceled):
	case err != nil:
		m.conns.WithLabelValues(m.label(stack), outcomeUnreachable).Inc()
	default:
		m.dial.WithLabelValues(m.label(stack)).Observe(took.Seconds())
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

// HandshakeDone counts a handshake that succeeded after took.
func (m *Metrics) HandshakeDone(took time.Duration) {
	if m != nil {
		m.handshake.WithLabelValues(OutcomeOK).Observe(took.Seconds())
	}
}

// HandshakeFailed counts a handshake refused, or failed, for reason
// after took: a refusal, and its time.
func (m *Metrics) HandshakeFailed(reason string, took time.Duration) {
	if m != nil {
		m.refusals.WithLabelValues(reason).Inc()
		m.handshake.WithLabelValues(reason).Observe(took.Seconds())
	}
}

// Handshook is a vlink.ListenConfig.Observe: each handshake's time, by
// outcome, and the failures' reasons.
func (m *Metrics) Handshook(_ *vlink.Conn, took time.Duration, err error) {
	if err == nil {
		m.HandshakeDone(took)
		return
	}
	m.HandshakeFailed(refusalReason(err), took)
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
