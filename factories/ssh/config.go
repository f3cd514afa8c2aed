package ssh

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	sshconfig "github.com/kevinburke/ssh_config"
)

// maxJumps bounds ProxyJump chains, which the config could make circular.
const maxJumps = 8

// A target is the SSH server with the options and the ssh config applied.
type target struct {
	alias    string // as the user wrote it, for the config and messages
	hostname string
	port     int
	user     string
	// identities are the key files to try; defaulted ones may be
	// missing and are then skipped without a word.
	identities        []string
	defaultIdentities bool
	// jumps are the ProxyJump hops, the first reached first.
	jumps []*Factory
}

func (t target) addr() string { return net.JoinHostPort(t.hostname, strconv.Itoa(t.port)) }

func (t target) String() string { return t.user + "@" + t.addr() }

// resolve applies the ssh config to the options, as ssh does: explicit
// options first, then the first value the config gives, then defaults.
func resolve(o Options) (target, error) {
	return resolveDepth(o, 0)
}

// resolveDepth is resolve for a server reached through depth ProxyJump
// hops.
func resolveDepth(o Options, depth int) (target, error) {
	t := target{alias: o.Host}
	specUser, spec, specPort, err := parseHost(o.Host)
	if err != nil {
		return t, err
	}
	t.alias = spec
	cfgs, err := loadConfigs(o.ConfigFile)
	if err != nil {
		return t, err
	}
	cfg := hostConfig{cfgs: cfgs, host: spec}

	t.hostname = spec
	if hn := cfg.get("HostName"); hn != "" {
		t.hostname = strings.ReplaceAll(strings.ReplaceAll(hn, "%h", spec), "%%", "%")
		if err := checkHostName(t.hostname); err != nil {
			return t, fmt.Errorf("HostName of %s in the ssh config: %w", spec, err)
		}
	}
	if t.port, err = resolvePort(o, specPort, cfg); err != nil {
		return t, err
	}
	localUser := ""
	if u, err := user.Current(); err == nil {
		localUser = u.Username
	}
	t.user = cmp.Or(o.User, specUser, cfg.get("User"), localUser)
	if t.user == "" {
		return t, errors.New("no user to log in as: give user")
	}
	t.identities, t.defaultIdentities = resolveIdentities(o, cfg, t, localUser)
	if t.jumps, err = resolveJumps(o, cfg, depth); err != nil {
		return t, err
	}
	return t, nil
}

// parseHost splits the host option, [USER@]HOST[:PORT] (a literal IPv6
// address in brackets), into its parts; port is 0 if not given.
func parseHost(host string) (userName, name string, port int, err error) {
	name = host
	if i := strings.LastIndexByte(name, '@'); i >= 0 {
		userName, name = name[:i], name[i+1:]
		if userName == "" {
			return "", "", 0, fmt.Errorf("host %q: empty user before @", host)
		}
	}
	if h, p, err := net.SplitHostPort(name); err == nil {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return "", "", 0, fmt.Errorf("host %q: bad port %q", host, p)
		}
		name, port = h, int(n)
	} else if strings.HasPrefix(name, "[") && strings.HasSuffix(name, "]") {
		name = name[1 : len(name)-1]
	}
	if name == "" {
		return "", "", 0, fmt.Errorf("host %q: no host name", host)
	}
	if err := checkHostName(name); err != nil {
		return "", "", 0, err
	}
	return userName, name, port, nil
}

// hostConfig is what the ssh config files say about one host, the first
// file that says it winning.
type hostConfig struct {
	cfgs []*sshconfig.Config
	host string
}

func (c hostConfig) get(key string) string {
	for _, cfg := range c.cfgs {
		if v, err := cfg.Get(c.host, key); err == nil && v != "" {
			return v
		}
	}
	return ""
}

func (c hostConfig) getAll(key string) []string {
	var all []string
	for _, cfg := range c.cfgs {
		if vs, err := cfg.GetAll(c.host, key); err == nil {
			all = append(all, vs...)
		}
	}
	return all
}

// resolvePort takes the port option, then the host's, then the config's,
// then 22.
func resolvePort(o Options, specPort int, cfg hostConfig) (int, error) {
	switch p := cfg.get("Port"); {
	case o.Port > 0:
		return o.Port, nil
	case specPort > 0:
		return specPort, nil
	case p != "":
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return 0, fmt.Errorf("Port %q of %s in the ssh config", p, cfg.host)
		}
		return int(n), nil
	}
	return 22, nil
}

// resolveIdentities returns the key files to try: the option's, else the
// config's (with ssh's ~ and % expansions), else ssh's defaults, which
// may be missing (defaulted is then true).
func resolveIdentities(o Options, cfg hostConfig, t target, localUser string) (files []string, defaulted bool) {
	home, _ := os.UserHomeDir()
	expand := func(p string) string {
		if p == "~" || strings.HasPrefix(p, "~/") {
			p = home + p[1:]
		}
		r := strings.NewReplacer("%d", home, "%u", localUser, "%h", t.hostname, "%r", t.user, "%%", "%")
		return r.Replace(p)
	}
	ids := o.IdentityFiles
	if len(ids) == 0 {
		ids = cfg.getAll("IdentityFile")
	}
	if len(ids) == 0 {
		for _, n := range []string{"id_ed25519", "id_ecdsa", "id_rsa"} {
			files = append(files, filepath.Join(home, ".ssh", n))
		}
		return files, true
	}
	for _, p := range ids {
		files = append(files, expand(p))
	}
	return files, false
}

// resolveJumps resolves the config's ProxyJump hops, each with the same
// options but its own host.
func resolveJumps(o Options, cfg hostConfig, depth int) ([]*Factory, error) {
	pj := cfg.get("ProxyJump")
	if pj == "" || pj == "none" {
		return nil, nil
	}
	if depth >= maxJumps {
		return nil, fmt.Errorf("ProxyJump chain longer than %d hops (a loop in the ssh config?)", maxJumps)
	}
	var jumps []*Factory
	for _, hop := range strings.Split(pj, ",") {
		hop = strings.TrimSpace(strings.TrimPrefix(hop, "ssh://"))
		jo := o
		jo.Host, jo.Port, jo.User, jo.Netcat = hop, 0, "", false
		jt, err := resolveDepth(jo, depth+1)
		if err != nil {
			return nil, fmt.Errorf("ProxyJump %s of %s: %w", hop, cfg.host, err)
		}
		jumps = append(jumps, &Factory{o: jo, t: jt})
	}
	return jumps, nil
}

// checkHostName refuses host names that could only be an attempt to
// smuggle something into a command line or a known_hosts line.
func checkHostName(h string) error {
	if _, err := netip.ParseAddr(h); err == nil {
		return nil
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_'
		if !ok {
			return fmt.Errorf("host name %q: only letters, digits, '-', '.' and '_' are allowed", h)
		}
	}
	return nil
}

// loadConfigs reads the ssh config files: the named one, or the user's
// and the system's where they exist.
func loadConfigs(name string) ([]*sshconfig.Config, error) {
	var files []string
	explicit := false
	switch name {
	case "none":
		return nil, nil
	case "":
		if home, err := os.UserHomeDir(); err == nil {
			files = append(files, filepath.Join(home, ".ssh", "config"))
		}
		files = append(files, "/etc/ssh/ssh_config")
	default:
		files, explicit = []string{name}, true
	}
	var cfgs []*sshconfig.Config
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			if !explicit && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("ssh config: %w", err)
		}
		c, err := sshconfig.DecodeBytes(b)
		if err != nil {
			return nil, fmt.Errorf("ssh config %s: %w", f, err)
		}
		cfgs = append(cfgs, c)
	}
	return cfgs, nil
}
