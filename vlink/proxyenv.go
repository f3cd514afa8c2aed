package vlink

import (
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/vlink-dev/vlink/selector"
)

// EnvProxyFromEnvironment, set to 1 or true, makes the default
// configuration (ConfigFromEnv) take the proxy of the environment, as
// proxy_from_environment = true does in a config file. vlink honours
// ALL_PROXY and the others only when asked: a variable meant for curl
// would otherwise silently move every connection of every program.
const EnvProxyFromEnvironment = "VLINK_PROXY_FROM_ENVIRONMENT"

// proxyVars are the variables holding the proxy, in the order they are
// read. A dialer of TCP connections does not know their protocol, so the
// proxy for everything (ALL_PROXY) comes first, then HTTPS_PROXY, which
// users behind a corporate proxy set most often.
var proxyVars = []string{"ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"}

// noProxyVars list the destinations that stay direct.
var noProxyVars = []string{"NO_PROXY", "no_proxy"}

// loopbackDirect keeps loopback destinations off the proxy whatever
// NO_PROXY says, as net/http's ProxyFromEnvironment does: a proxy's
// loopback is another host's.
var loopbackDirect = []selector.Rule{
	{Host: "localhost", Action: selector.Direct},
	{Host: "*.localhost", Action: selector.Direct},
	{Host: "127.0.0.0/8", Action: selector.Direct},
	{Host: "::1", Action: selector.Direct},
}

// WithProxyFromEnvironment returns c with the proxy of the environment
// as its default route: destinations none of c's routes matches go
// through the proxy URL of ALL_PROXY (else all_proxy, HTTPS_PROXY,
// https_proxy), socks5h://proxy:1080 and the like (see Stack for the
// schemes), except loopback and what NO_PROXY (no_proxy) lists, which go
// direct. NO_PROXY is read as curl and net/http read it: comma-separated
// names (example.com: it and its subdomains; .example.com: subdomains
// only), IP addresses and CIDR prefixes, each with an optional :port; *
// means no proxy at all. Without a proxy in the environment, c is
// returned as it is. A c whose default route is not direct is refused:
// the two would both decide where unmatched destinations go.
func (c *Config) WithProxyFromEnvironment() (*Config, error) {
	name, proxy := "", ""
	for _, v := range proxyVars {
		if p := strings.TrimSpace(os.Getenv(v)); p != "" {
			name, proxy = v, p
			break
		}
	}
	if proxy == "" {
		return c, nil
	}
	if !strings.Contains(proxy, "://") {
		// curl takes a bare host:port as an HTTP proxy; so do we, but
		// naming the scheme says which proxy it is.
		proxy = "http://" + proxy
	}
	s, err := Parse(proxy)
	if err != nil {
		return nil, fmt.Errorf("vlink: %s: %w", name, err)
	}
	var noProxy string
	for _, v := range noProxyVars {
		if noProxy = os.Getenv(v); noProxy != "" {
			break
		}
	}
	direct, all, err := noProxyRules(noProxy)
	if err != nil {
		return nil, err
	}
	if all {
		return c, nil
	}
	var rules []selector.Rule
	if c.sel != nil {
		if d := c.sel.Default(); d.Action != selector.Direct {
			return nil, fmt.Errorf("vlink: config %s: the proxy of the environment (%s) and the default route both say where unmatched destinations go: keep one", c.Source, name)
		}
		rules = c.sel.Rules()
	}
	rules = append(append(rules, loopbackDirect...), direct...)
	nc, err := NewConfig(rules, selector.Rule{Stack: s.text()}, c.Key)
	if err != nil {
		return nil, err
	}
	nc.Source = strings.TrimPrefix(c.Source+" + "+name, " + ")
	nc.Node, nc.PeerKey, nc.only, nc.exclude = c.Node, c.PeerKey, c.only, c.exclude
	nc.proxyFromEnv = true
	return nc, nil
}

// noProxyRules reads a NO_PROXY value into direct rules; all reports "*".
func noProxyRules(v string) (rules []selector.Rule, all bool, err error) {
	for e := range strings.SplitSeq(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if e == "*" {
			return nil, true, nil
		}
		host, port := e, ""
		if h, p, err := net.SplitHostPort(e); err == nil {
			host, port = h, p
		}
		host = strings.TrimPrefix(host, "*")
		var hosts []string
		switch {
		case strings.HasPrefix(host, "."): // subdomains only
			hosts = []string{"*" + host}
		case strings.Contains(host, "/") || net.ParseIP(host) != nil:
			hosts = []string{host}
		default: // the name and its subdomains
			hosts = []string{host, "*." + host}
		}
		for _, h := range hosts {
			r := selector.Rule{Host: h, Ports: port, Action: selector.Direct}
			if err := r.Validate(); err != nil {
				return nil, false, fmt.Errorf("vlink: NO_PROXY entry %q: %w", e, err)
			}
			rules = append(rules, r)
		}
	}
	return rules, false, nil
}
