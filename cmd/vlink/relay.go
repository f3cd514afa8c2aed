package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/metrics"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/control"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

var relayCmd = &cli.Command{
	Name:     "relay",
	Summary:  "run the rendezvous of a vlink network: nodes behind firewalls reach each other by name",
	Synopsis: "--cert FILE --cert-key FILE --owner FILE | --key-file NETWORK_KEY [--listen ADDR] [flags]",
	About: `
Runs the relay of a vlink network. Nodes (vlink serve --node, vlink tunnel
--node, vlink socks --node, programs using package vlink/control) keep one
outbound, encrypted control connection to it, so a node behind a firewall
that blocks every inbound connection is still reachable: other nodes dial
NAME.vlink.alt:PORT, and the relay carries the bytes (encrypted end to end
by the two nodes) when nothing better exists.

With an owner (--cert, --cert-key, --owner: see vlink owner and vlink cert),
each node registers with its certificate, which names it, and proves it
holds the certificate's key; the relay holds no key of any node's, and the
connections it carries between nodes are encrypted end to end with the
nodes' own keys: it cannot read or alter them. SIGHUP rereads
--revocations and drops the nodes whose certificates it now revokes.

Several relays of one owner form one network: give each the others with
--peer (or list each pair once; a relay takes links from the relays that
list it). A node registered with any of them reaches a node registered
with another; the relays pass the connection on between them and still
hold no key that opens it. Give nodes every relay (--relay R1,R2): when
theirs dies they register with the next within about a second.

With a network key instead (--key-file), each node proves the key derived
from the network key for its name (vlink key --node NAME), so no node can
register or answer as another; but the relay, which holds the network key
and hands out each relayed connection's key, could read what it carries.

Either way, the relay serves registered nodes only, never an open proxy: it
connects nobody to an address, and a node decides which of its ports it
exposes (vlink serve --allow). It listens on loopback unless --listen says otherwise: use
--listen 0.0.0.0:7100 to serve other machines.
`,
	Examples: `
  vlink owner init --out owner.key
  vlink key --identity --out relay.key
  vlink cert sign --owner owner.key --relay --name relay --pub "$(vlink key --pub relay.key)"
  vlink relay --listen 0.0.0.0:7100 --cert relay.crt --cert-key relay.key --owner owner.key.pub

  # a second relay, linked with the first: one network
  vlink relay --listen 0.0.0.0:7100 --cert relay-2.crt --cert-key relay-2.key --owner owner.key.pub --peer relay-1.example.net:7100

  vlink key --out network.key
  vlink relay --listen 0.0.0.0:7100 --key-file network.key
`,
	Flags: base.WithEnv(relayFlags),
}

func relayFlags(fs *flag.FlagSet) func(context.Context, *base.Env) int {
	var listen, keyFile, metricsAddr, peers string
	var member relayMember
	var maxNodes, maxRelayed int
	var idle, grace time.Duration
	fs.StringVar(&listen, "listen", "127.0.0.1:7100", "accept nodes on `ADDR` (host:port); a non-loopback address serves other hosts")
	fs.StringVar(&keyFile, "key-file", "", "the network key, in `FILE` (mode 600; vlink key --out FILE makes one), for a network without an owner (give this or --cert)")
	fs.StringVar(&member.cert, "cert", "", "the relay's certificate, in `FILE` (vlink cert sign --relay): nodes register with certificates of the same owner, and the relay holds none of their keys; needs --cert-key and --owner")
	fs.StringVar(&member.key, "cert-key", "", "the relay's own private key, in `FILE` (mode 600; vlink key --identity)")
	fs.StringVar(&member.owner, "owner", "", "the network owner's public key, in `FILE` (vlink owner init)")
	fs.StringVar(&member.revocations, "revocations", "", "the network's revocation list, in `FILE` (vlink cert revoke), reread on SIGHUP (default: none)")
	fs.StringVar(&peers, "peer", "", "link with the other relays of the network at `HOST:PORT`, comma-separated (each with a relay's certificate of the same owner), so that nodes registered with any reach each other; needs --cert (default: none)")
	fs.IntVar(&maxNodes, "max-nodes", control.DefaultMaxNodes, "register at most `N` nodes at once")
	fs.IntVar(&maxRelayed, "max-relayed", control.DefaultMaxRelayed, "carry at most `N` connections between nodes at once")
	fs.DurationVar(&idle, "idle-timeout", control.DefaultIdleTimeout, "drop a node silent for `DURATION` (nodes ping every 15s)")
	base.GraceVar(fs, &grace)
	fs.StringVar(&metricsAddr, "metrics", "", "serve Prometheus metrics on http://`ADDR`/metrics (host:port, e.g. 127.0.0.1:9464): nodes registered, connections relayed (open, total, bytes), refusals and failed logins by reason (default: none)")
	return func(ctx context.Context, e *base.Env) int {
		cfg := control.RelayConfig{MaxNodes: maxNodes, MaxRelayed: maxRelayed, IdleTimeout: idle, Logger: e.Log}
		for p := range strings.SplitSeq(peers, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			if err := base.CheckHostPort(p); err != nil {
				return base.Fail(e, "vlink relay", base.Usagef("--peer %v", err))
			}
			cfg.Peers = append(cfg.Peers, p)
		}
		if err := runRelay(ctx, e, listen, keyFile, member, metricsAddr, grace, cfg); err != nil {
			return base.Fail(e, "vlink relay", err)
		}
		return base.ExitOK
	}
}

// relayMember are the files that make the relay a member of a network
// with an owner.
type relayMember struct{ cert, key, owner, revocations string }

// load reads them, nil without --cert.
func (m relayMember) load() (*vlink.Member, error) {
	switch {
	case m.cert == "" && (m.key != "" || m.owner != "" || m.revocations != ""):
		return nil, base.Usagef("--cert-key, --owner and --revocations go with --cert, the relay's certificate")
	case m.cert == "":
		return nil, nil
	case m.key == "" || m.owner == "":
		return nil, base.Usagef("--cert needs --cert-key (the relay's private key, vlink key --identity) and --owner (the network owner's public key)")
	}
	cert, err := nodecert.ReadCertificateFile(m.cert)
	if err != nil {
		return nil, err
	}
	priv, err := vlink.ReadIdentityFile(m.key)
	if err != nil {
		return nil, err
	}
	owner, err := nodecert.ReadOwnerPublicKeyFile(m.owner)
	if err != nil {
		return nil, err
	}
	trust, err := nodecert.NewTrust(owner, m.revocations)
	if err != nil {
		return nil, err
	}
	return &vlink.Member{Cert: cert, Private: priv, Trust: trust}, nil
}

func runRelay(ctx context.Context, e *base.Env, listen, keyFile string, mf relayMember, metricsAddr string, grace time.Duration, cfg control.RelayConfig) error {
	member, err := mf.load()
	if err != nil {
		return err
	}
	switch {
	case member == nil && keyFile == "":
		return base.Usagef("give the relay --cert, --cert-key and --owner (a network with an owner: vlink owner init, vlink cert sign --relay) or --key-file NETWORK_KEY (vlink key --out FILE)")
	case member != nil && keyFile != "":
		return base.Usagef("--cert and --key-file: a network has an owner or a network key, not both; nodes of the two would not reach each other")
	}
	if member == nil && len(cfg.Peers) > 0 {
		return base.Usagef("--peer links relays of a network with an owner (--cert): with a network key, any node could pass for a relay")
	}
	cfg.Member = member
	if err := base.CheckHostPort(listen); err != nil {
		return base.Usagef("--listen %v", err)
	}
	if cfg.MaxNodes <= 0 || cfg.MaxRelayed <= 0 || cfg.IdleTimeout <= 0 || grace < 0 {
		return base.Usagef("--max-nodes, --max-relayed and --idle-timeout want positive values, --grace a duration")
	}
	var key []byte
	if keyFile != "" {
		if key, err = vlink.ReadKeyFile(keyFile); err != nil {
			return err
		}
	}
	r, err := control.NewRelay(cfg)
	if err != nil {
		return err
	}
	m, stopMetrics, err := metrics.Serve(ctx, e, metricsAddr)
	if err != nil {
		return err
	}
	defer stopMetrics()
	if m != nil {
		m.Reg.MustRegister(relayCollector{r})
	}
	l, err := r.Listen(ctx, listen, key)
	if err != nil {
		return err
	}
	if member != nil {
		e.Log.Info("relay listening", "addr", l.Addr().String(), "cert", member.Cert.Name(), "owner", member.Trust.Owner().Fingerprint(), "revoked", member.Trust.Revocations().Len(), "peers", strings.Join(cfg.Peers, ","))
	} else {
		e.Log.Info("relay listening", "addr", l.Addr().String())
	}
	served := make(chan error, 1)
	go func() { served <- r.Serve(l) }()
	hup := make(chan os.Signal, 1)
	if member != nil {
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}
	for wait := true; wait; {
		select {
		case err := <-served:
			r.Close()
			return err
		case <-hup:
			if err := member.Trust.Reload(); err != nil {
				e.Log.Error("relay: revocation list not reloaded, the old one stays", "file", mf.revocations, "err", err)
				continue
			}
			e.Log.Info("relay: revocation list reloaded", "file", mf.revocations, "revoked", member.Trust.Revocations().Len(), "dropped", r.Recheck())
		case <-ctx.Done():
			wait = false
		}
	}
	// Stop taking nodes, let the connections being relayed finish
	// within the grace period, then cut them (with a reset).
	l.Close()
	<-served
	for deadline := time.Now().Add(grace); r.Relayed() > 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if n := r.Relayed(); n > 0 {
		e.Log.Info("relay: cutting connections still relayed after the grace period", "connections", n)
	}
	return r.Close()
}

// relayCollector exports a relay's figures, read at each scrape.
type relayCollector struct{ r *control.Relay }

var (
	relayNodes = prometheus.NewDesc("vlink_relay_nodes",
		"Nodes registered with the relay.", nil, nil)
	relayPeers = prometheus.NewDesc("vlink_relay_peers",
		"Other relays of the network this relay is linked with (--peer).", nil, nil)
	relayRemoteNodes = prometheus.NewDesc("vlink_relay_remote_nodes",
		"Nodes registered with the linked relays, as they announced them.", nil, nil)
	relayOpen = prometheus.NewDesc("vlink_relay_connections_open",
		"Connections between nodes the relay carries now.", nil, nil)
	relayTotal = prometheus.NewDesc("vlink_relay_connections_total",
		"Connections between nodes the relay carried.", nil, nil)
	relayBytes = prometheus.NewDesc("vlink_relay_bytes_total",
		"Bytes the relay carried between nodes, both ways, counted as each connection ends.", nil, nil)
	relayRegistrations = prometheus.NewDesc("vlink_relay_registrations_total",
		"Node registrations, again after a reconnect included.", nil, nil)
	relayRefused = prometheus.NewDesc("vlink_relay_refusals_total",
		"Messages and connections the relay refused, by reason (no such node, busy, forbidden, timed out).", []string{"reason"}, nil)
	relayFailedLogins = prometheus.NewDesc("vlink_relay_failed_logins_total",
		"Connections refused before a node registered or a relayed connection attached, by reason (authentication failed or required, malformed, refused, not encrypted, handshake failed).", []string{"reason"}, nil)
)

func (c relayCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{relayNodes, relayPeers, relayRemoteNodes, relayOpen, relayTotal, relayBytes, relayRegistrations, relayRefused, relayFailedLogins} {
		ch <- d
	}
}

func (c relayCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.r.Stats()
	ch <- prometheus.MustNewConstMetric(relayNodes, prometheus.GaugeValue, float64(s.Nodes))
	ch <- prometheus.MustNewConstMetric(relayPeers, prometheus.GaugeValue, float64(s.Peers))
	ch <- prometheus.MustNewConstMetric(relayRemoteNodes, prometheus.GaugeValue, float64(s.RemoteNodes))
	ch <- prometheus.MustNewConstMetric(relayOpen, prometheus.GaugeValue, float64(s.Relayed))
	ch <- prometheus.MustNewConstMetric(relayTotal, prometheus.CounterValue, float64(s.RelayedTotal))
	ch <- prometheus.MustNewConstMetric(relayBytes, prometheus.CounterValue, float64(s.RelayedBytes))
	ch <- prometheus.MustNewConstMetric(relayRegistrations, prometheus.CounterValue, float64(s.Registrations))
	for reason, n := range s.Refused {
		ch <- prometheus.MustNewConstMetric(relayRefused, prometheus.CounterValue, float64(n), reason)
	}
	for reason, n := range s.FailedLogins {
		ch <- prometheus.MustNewConstMetric(relayFailedLogins, prometheus.CounterValue, float64(n), reason)
	}
}
