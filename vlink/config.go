package vlink

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/pelletier/go-toml/v2"

	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/internal/tomlerr"
	"github.com/vlink-dev/vlink/selector"
)

// Environment variables read by [ConfigFromEnv].
const (
	// EnvConfig names the config file. Unset: $XDG_CONFIG_HOME/vlink/config.toml
	// (os.UserConfigDir), if it exists.
	EnvConfig = "VLINK_CONFIG"
	// EnvStack replaces the config's default route with this stack (text
	// form); the config's routes still come first.
	EnvStack = "VLINK_STACK"
	// EnvVia sets the gateway for EnvStack.
	EnvVia = "VLINK_VIA"
	// EnvKeyFile names a file holding the pre-shared key.
	EnvKeyFile = "VLINK_KEY_FILE"
	// EnvNode sets the node name (Config.Node).
	EnvNode = "VLINK_NODE"
)

// A Config routes destinations to stacks: the first matching route wins,
// and the default route applies when none matches. The zero Config sends
// everything direct, as net.Dial would.
type Config struct {
	// Source says where the config came from, for diagnostics.
	Source string
	// Key is the pre-shared key proven to listeners that require one.
	Key []byte
	// Node is this host's node name (see Dialer.Node): Key is then that
	// node's key, NodeKey(network key, Node). Empty: none.
	Node string
	// PeerKey checks the identity a listener announces, for Dialers that
	// have none of their own (see Dialer.PeerKey). Nil: none.
	PeerKey PeerKeyCallback
	// PinnedKey gives the keys PeerKey pinned, for Dialers that have
	// none of their own (see Dialer.PinnedKey). Nil: none.
	PinnedKey func(address string) []byte
	// Shm says when dials to this machine take shared memory, for
	// Dialers that do not say and a $VLINK_SHM that does not either (see
	// ShmMode); the config file's shm key. Zero: auto.
	Shm ShmMode

	sel    *selector.Selector
	stacks map[string]Stack  // parsed stacks by text form
	shown  map[string]string // the text forms, redacted, as reports show them
	// only and exclude narrow best-effort routes' ways (EnvPathsOnly,
	// EnvPathsExclude).
	only, exclude []string
	// proxyFromEnv: WithProxyFromEnvironment found a proxy and took it.
	proxyFromEnv bool
	// file is the digest of the file LoadConfig read (its path and
	// bytes); digest, of all the config was made from (Digest).
	file, digest [32]byte
}

// Digest identifies what c was made from: the config file's bytes, the
// key's, and the environment variables ConfigFromEnv read. Two configs
// made from the same have the same digest; a file edited since gives
// another, so a reload can tell whether reading it again changed
// anything. The zero Config's is zero.
func (c *Config) Digest() [32]byte { return c.digest }

// sum is the digest of parts, each length-prefixed.
func sum(parts ...[]byte) [32]byte {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:", len(p))
		h.Write(p)
	}
	return [32]byte(h.Sum(nil))
}

// configFile is the TOML form of a config file:
//
//	key_file = "vlink.key"          # relative to the file's folder
//	node = "alice"                  # this node's name; key_file holds its node key
//	proxy_from_environment = true   # unmatched destinations: ALL_PROXY, but NO_PROXY's
//	shm = "auto"                    # dials to this machine: shared memory when offered; "on", "off"
//
//	[default]                       # when no route matches; absent: direct
//	stack = "zstd"
//	via = "gateway.example:7000"
//
//	[[route]]
//	host = "*.corp.example"         # glob, IP or CIDR
//	ports = "443,8000-8100"
//	stack = "zstd:level=3"          # or layers = [{layer = "zstd", params = {level = 3}}]
//	via = "gateway.example:7000"
//
//	[[route]]
//	host = "10.0.0.0/8"
//	action = "refuse"
//
//	[[route]]
//	host = "db.corp.example"         # best effort: race these ways, best first
//	try = ["direct", "ssh:host=bastion.corp.example", "socks5:addr=proxy.corp.example:1080"]
type configFile struct {
	KeyFile string `toml:"key_file"`
	Node    string `toml:"node"`
	// ProxyFromEnvironment: see Config.WithProxyFromEnvironment.
	ProxyFromEnvironment bool        `toml:"proxy_from_environment"`
	Shm                  string      `toml:"shm"`
	Default              *fileRoute  `toml:"default"`
	Routes               []fileRoute `toml:"route"`
}

type fileRoute struct {
	Host   string          `toml:"host"`
	Ports  string          `toml:"ports"`
	Action selector.Action `toml:"action"`
	Stack  string          `toml:"stack"`
	Layers []LayerConfig   `toml:"layers"`
	Via    string          `toml:"via"`
	Try    []string        `toml:"try"`
}

// NewConfig builds a Config from rules, checking every stack they name.
func NewConfig(routes []selector.Rule, def selector.Rule, key []byte) (*Config, error) {
	if key != nil && len(key) < MinKeySize {
		return nil, fmt.Errorf("vlink: config: key is %d bytes, want at least %d", len(key), MinKeySize)
	}
	c := &Config{Key: key, stacks: map[string]Stack{}, shown: map[string]string{}}
	all := append(append([]selector.Rule(nil), routes...), def)
	for i, r := range all {
		fail := func(err error) (*Config, error) {
			if i == len(all)-1 {
				return nil, fmt.Errorf("vlink: config: default route: %w", err)
			}
			return nil, fmt.Errorf("vlink: config: route %d: %w", i+1, err)
		}
		texts := r.Try
		if r.Stack != "" || r.Via != "" {
			texts = []string{r.Stack}
		}
		if len(r.Try) > 0 && r.Stack == "" && r.Via == "" && isNodeHost(r.Host) {
			return fail(fmt.Errorf("%w: host %s names nodes of a vlink network, whose path (splice, reverse, relay) the network chooses; a try list does not apply: give a stack (stack = \"zstd\"), or narrow the paths with %s", ErrBadStack, r.Host, EnvPathsOnly))
		}
		for _, text := range texts {
			if text == selector.TryDirect && len(r.Try) > 0 {
				continue
			}
			s, err := Parse(text)
			if err != nil {
				return fail(err)
			}
			if f := s.factories(); len(r.Try) > 0 && len(f) == 1 && lookup(f[0].Name) != nil && lookup(f[0].Name).Nodes {
				return fail(fmt.Errorf("%w: try way %q reaches nodes of a vlink network (NODE%s), which a try list does not race: the network chooses a node's path; give its stack in a rule for *%s (stack = \"%s\")", ErrBadStack, text, NodeSuffix, NodeSuffix, text))
			}
			c.stacks[text], c.shown[text] = s, secret.RedactStack(text)
		}
	}
	sel, err := selector.New(routes, def)
	if err != nil {
		return nil, fmt.Errorf("vlink: config: %w", err)
	}
	c.sel = sel
	return c, nil
}

// LoadConfig reads a TOML config file (docs/REFERENCE.md describes the
// format). Unknown keys are errors, so a typo does not silently route
// traffic the wrong way.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("vlink: config: %w", err)
	}
	var f configFile
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("vlink: config %w", tomlerr.New(path, err))
	}
	conv := func(fr *fileRoute, what string) (selector.Rule, error) {
		r := selector.Rule{Host: fr.Host, Ports: fr.Ports, Action: fr.Action, Stack: fr.Stack, Via: fr.Via, Try: fr.Try}
		if fr.Layers != nil {
			if fr.Stack != "" {
				return r, fmt.Errorf("vlink: config %s: %s: give stack or layers, not both", path, what)
			}
			s, err := FromConfig(fr.Layers)
			if err != nil {
				return r, fmt.Errorf("vlink: config %s: %s: %w", path, what, err)
			}
			r.Stack = s.text() // parsed again when the route is taken
		}
		return r, nil
	}
	var routes []selector.Rule
	for i := range f.Routes {
		r, err := conv(&f.Routes[i], fmt.Sprintf("route %d", i+1))
		if err != nil {
			return nil, err
		}
		routes = append(routes, r)
	}
	var def selector.Rule
	if f.Default != nil {
		if def, err = conv(f.Default, "default"); err != nil {
			return nil, err
		}
	}
	if f.Node != "" && !ValidNodeName(f.Node) {
		return nil, fmt.Errorf("vlink: config %s: node %q: %w", path, f.Node, ErrBadNodeName)
	}
	var key []byte
	if f.KeyFile != "" {
		kf := f.KeyFile
		if !filepath.IsAbs(kf) {
			kf = filepath.Join(filepath.Dir(path), kf)
		}
		if key, err = ReadKeyFile(kf); err != nil {
			return nil, fmt.Errorf("vlink: config %s: %w", path, err)
		}
	}
	c, err := NewConfig(routes, def, key)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c.Source = path
	c.Node = f.Node
	c.file = sum([]byte(path), data)
	c.digest = sum(c.file[:], key)
	if c.Shm, err = parseShmMode(f.Shm); err != nil {
		return nil, fmt.Errorf("vlink: config %s: %w", path, err)
	}
	if f.ProxyFromEnvironment {
		return c.WithProxyFromEnvironment()
	}
	return c, nil
}

// ReadKeyFile reads a pre-shared key. Surrounding white space is not part
// of the key. The file must not be readable by others.
func ReadKeyFile(path string) ([]byte, error) {
	b, err := readSecretFile(path, "key file")
	if err != nil {
		return nil, err
	}
	if len(b) < MinKeySize {
		return nil, fmt.Errorf("key file %s holds %d bytes, want at least %d", path, len(b), MinKeySize)
	}
	return b, nil
}

// readSecretFile reads a file only its owner may read, trimmed of
// surrounding space; what names the file in errors. The rule is
// secret.ReadFile's, shared with the files of package nodecert.
func readSecretFile(path, what string) ([]byte, error) {
	return secret.ReadFile(path, what)
}

// ConfigFromEnv loads the user's configuration: the file named by
// VLINK_CONFIG (or the default path if that file exists), then
// VLINK_STACK, VLINK_VIA, VLINK_KEY_FILE and VLINK_NODE on top, and
// VLINK_PATHS_ONLY and VLINK_PATHS_EXCLUDE for best-effort routes. With none of them it
// returns the zero Config: everything direct.
func ConfigFromEnv() (*Config, error) {
	path, explicit := os.LookupEnv(EnvConfig)
	if !explicit {
		if dir, err := os.UserConfigDir(); err == nil {
			path = filepath.Join(dir, "vlink", "config.toml")
		}
	}
	c := &Config{}
	var file [32]byte
	if path != "" {
		lc, err := LoadConfig(path)
		switch {
		case err == nil:
			c, file = lc, lc.file
		case explicit || !errors.Is(err, fs.ErrNotExist):
			return nil, err
		}
	}
	if kf := os.Getenv(EnvKeyFile); kf != "" {
		key, err := ReadKeyFile(kf)
		if err != nil {
			return nil, fmt.Errorf("vlink: %s: %w", EnvKeyFile, err)
		}
		c.Key = key
	}
	if n := os.Getenv(EnvNode); n != "" {
		if !ValidNodeName(n) {
			return nil, fmt.Errorf("vlink: %s=%s: %w", EnvNode, n, ErrBadNodeName)
		}
		c.Node = n
	}
	if st := os.Getenv(EnvStack); st != "" {
		var rules []selector.Rule
		if c.sel != nil {
			rules = c.sel.Rules()
		}
		nc, err := NewConfig(rules, selector.Rule{Stack: st, Via: os.Getenv(EnvVia)}, c.Key)
		if err != nil {
			return nil, fmt.Errorf("vlink: %s: %w", EnvStack, err) // err shows the stack, redacted
		}
		nc.Source = strings.TrimPrefix(c.Source+" + "+EnvStack, " + ")
		nc.Node = c.Node
		c = nc
	} else if os.Getenv(EnvVia) != "" {
		return nil, fmt.Errorf("vlink: %s is set without %s", EnvVia, EnvStack)
	}
	c.pathsFromEnv()
	if v := os.Getenv(EnvProxyFromEnvironment); v != "" && !c.proxyFromEnv {
		switch strings.ToLower(v) {
		case "1", "true", "yes":
			pc, err := c.WithProxyFromEnvironment()
			if err != nil {
				return nil, err
			}
			c = pc
		case "0", "false", "no":
		default:
			return nil, fmt.Errorf("vlink: %s=%s: want 1 or 0", EnvProxyFromEnvironment, v)
		}
	}
	parts := [][]byte{file[:], c.Key}
	for _, v := range envDigested {
		parts = append(parts, []byte(v+"="+os.Getenv(v)))
	}
	c.digest = sum(parts...)
	return c, nil
}

// envDigested are the variables a config from ConfigFromEnv depends on,
// beside its file and its key: its Digest covers them.
var envDigested = append([]string{EnvConfig, EnvKeyFile, EnvNode, EnvStack, EnvVia, EnvPathsOnly, EnvPathsExclude, EnvProxyFromEnvironment},
	append(proxyVars, noProxyVars...)...)

var defaultConfig struct {
	once sync.Once
	c    *Config
	err  error
}

// DefaultConfig returns ConfigFromEnv's result, read once per process.
func DefaultConfig() (*Config, error) {
	defaultConfig.once.Do(func() { defaultConfig.c, defaultConfig.err = ConfigFromEnv() })
	return defaultConfig.c, defaultConfig.err
}

// route picks the route for address.
func (c *Config) route(address string) (*route, error) {
	if c.sel == nil {
		return &route{}, nil // the zero Config: direct
	}
	r, err := c.sel.Match(address)
	if err != nil {
		return nil, err
	}
	switch r.Action {
	case selector.Refuse:
		return nil, fmt.Errorf("%w (%s)", ErrDirectRefused, c.Source)
	case selector.Stack:
		return &route{stack: c.stacks[r.Stack], via: r.Via, key: c.Key, node: c.Node}, nil
	case selector.BestEffort:
		return &route{best: true, ways: c.ways(r.Try), rule: r, key: c.Key, node: c.Node}, nil
	}
	return &route{}, nil
}

// Selector returns the config's routing rules, compiled, for callers
// that must know a destination's route before dialing it (the preload
// agent lets a program connect by itself when the route is direct). The
// zero Config has none: nil, whose Match answers direct for everything.
func (c *Config) Selector() *selector.Selector { return c.sel }

// String describes the config's routes, one per line.
func (c *Config) String() string {
	if c.sel == nil {
		return "default: direct"
	}
	return c.sel.String()
}

// isNodeHost reports whether a rule's host pattern names only nodes of
// a vlink network: it ends with NodeSuffix.
func isNodeHost(host string) bool {
	return strings.HasSuffix(strings.TrimSuffix(strings.ToLower(host), "."), NodeSuffix)
}
