package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vlink-dev/vlink/filters/compress"
	"github.com/vlink-dev/vlink/filters/mux"
	"github.com/vlink-dev/vlink/parallelstreams"
)

// layerCollector exports the layers' own counts (compress, mux,
// parallelstreams), read at each scrape: the layers keep them as atomic
// counters and know nothing of Prometheus.
type layerCollector struct{}

var (
	compressApp = prometheus.NewDesc("vlink_compress_application_bytes_total",
		"Application bytes through the compression layers, by layer and direction (out: written, compressed by this process; in: decoded for it). Divided by vlink_compress_wire_bytes_total, the compression ratio.",
		[]string{"layer", "direction"}, nil)
	compressWire = prometheus.NewDesc("vlink_compress_wire_bytes_total",
		"Bytes the compression layers sent (out) and received (in) on the wire, framing included, by layer and direction.",
		[]string{"layer", "direction"}, nil)
	adaptiveRung = prometheus.NewDesc("vlink_adaptive_rung_bytes_total",
		"Application bytes the adaptive layer wrote at each setting (off, s2-1, zstd-6, ...), probes included: where its controller chose to be.",
		[]string{"rung"}, nil)
	adaptiveMoves = prometheus.NewDesc("vlink_adaptive_moves_total",
		"Changes of setting by the adaptive layer's controllers.", nil, nil)
	muxSessions = prometheus.NewDesc("vlink_mux_sessions_total",
		"mux sessions started (connections below carrying streams), dialing and accepting.", nil, nil)
	muxSessionsOpen = prometheus.NewDesc("vlink_mux_sessions_open",
		"mux sessions not yet closed.", nil, nil)
	muxStreams = prometheus.NewDesc("vlink_mux_streams_total",
		"mux streams opened or accepted: the connections the sessions carried.", nil, nil)
	muxStreamsOpen = prometheus.NewDesc("vlink_mux_streams_open",
		"mux streams not yet closed.", nil, nil)
	parallelSessions = prometheus.NewDesc("vlink_parallel_sessions_total",
		"parallel sessions started: connections spread over several TCP connections.", nil, nil)
	parallelSessionsOpen = prometheus.NewDesc("vlink_parallel_sessions_open",
		"parallel sessions not yet torn down.", nil, nil)
	parallelSubstreams = prometheus.NewDesc("vlink_parallel_substreams_total",
		"TCP connections the parallel sessions put to work.", nil, nil)
	parallelOutOfOrder = prometheus.NewDesc("vlink_parallel_out_of_order_blocks_total",
		"Data blocks that arrived ahead of one sent before them and waited to be put back in order.", nil, nil)
)

func (layerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{compressApp, compressWire, adaptiveRung, adaptiveMoves,
		muxSessions, muxSessionsOpen, muxStreams, muxStreamsOpen,
		parallelSessions, parallelSessionsOpen, parallelSubstreams, parallelOutOfOrder} {
		ch <- d
	}
}

func (layerCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	for _, s := range compress.ReadStats() {
		counter(compressApp, s.Written, s.Layer, "out")
		counter(compressApp, s.Decoded, s.Layer, "in")
		counter(compressWire, s.Sent, s.Layer, "out")
		counter(compressWire, s.Received, s.Layer, "in")
	}
	a := compress.ReadAdaptiveStats()
	for rung, v := range a.Rungs {
		counter(adaptiveRung, v, rung)
	}
	counter(adaptiveMoves, a.Moves)
	m := mux.ReadStats()
	counter(muxSessions, m.Sessions)
	gauge(muxSessionsOpen, m.SessionsOpen)
	counter(muxStreams, m.Streams)
	gauge(muxStreamsOpen, m.StreamsOpen)
	p := parallelstreams.ReadStats()
	counter(parallelSessions, p.Sessions)
	gauge(parallelSessionsOpen, p.SessionsOpen)
	counter(parallelSubstreams, p.Substreams)
	counter(parallelOutOfOrder, p.OutOfOrder)
}
