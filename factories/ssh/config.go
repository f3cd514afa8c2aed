package ssh

import (
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

func resolveDepth(o Options, depth int) (target, error) {
	t := target{alias: o.Host}
	spec := o.Host
	var specUser string
	if i := strings.LastIndexByte(spec, '@'); i >= 0 {
		specUser, spec = spec[:i], spec[i+1:]
		if specUser == "" {
			return t, fmt.Errorf("host %q: empty user before @", o.Host)
		}
	}
	specPort := 0
	if h, p, err := net.SplitHostPort(spec); err == nil {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return t, fmt.Errorf("host %q: bad port %q", o.Host, p)
		}
		spec, specPort = h, int(n)
	} else if strings.HasPrefix(spec, "[") && strings.HasSuffix(spec, "]") {
		spec = spec[1 : len(spec)-1]
	}
	if spec == "" {
		return t, fmt.Errorf("host %q: no host name", o.Host)
	}
	if err := checkHostName(spec); err != nil {
		return t, err
	}
	t.alias = spec

	cfgs, err := loadConfigs(o.ConfigFile)
	if err != nil {
		return t, err
	}
	get := func(key string) string {
		for _, c := range cfgs {
			if v, err := c.Get(spec, key); err == nil && v != "" {
				return v
			}
		}
		return ""
	}
	getAll := func(key string) []string {
		var all []string
		for _, c := range cfgs {
			if vs, err := c.GetAll(spec, key); err == nil {
				all = append(all, vs...)
			}
		}
		return all
	}

	t.hostname = spec
	if hn := get("HostName"); hn != "" {
		t.hostname = strings.ReplaceAll(strings.ReplaceAll(hn, "%h", spec), "%%", "%")
		if err := checkHostName(t.hostname); err != nil {
			return t, fmt.Errorf("HostName of %s in the ssh config: %w", spec, err)
		}
	}
	switch {
	case o.Port > 0:
		t.port = o.Port
	case specPort > 0:
		t.port = specPort
	case get("Port") != "":
		n, err := strconv.ParseUint(get("Port"), 10, 16)
		if err != nil || n == 0 {
			return t, fmt.Errorf("Port %q of %s in the ssh config", get("Port"), spec)
		}
		t.port = int(n)
	default:
		t.port = 22
	}
	localUser := ""
	if u, err := user.Current(); err == nil {
		localUser = u.Username
	}
	switch {
	case o.User != "":
		t.user = o.User
	case specUser != "":
		t.user = specUser
	case get("User") != "":
		t.user = get("User")
	default:
		t.user = localUser
	}
	if t.user == "" {
		return t, errors.New("no user to log in as: give user")
	}

	home, _ := os.UserHomeDir()
	expand := func(p string) string {
		if p == "~" || strings.HasPrefix(p, "~/") {
			p = home + p[1:]
		}
		r := strings.NewReplacer("%d", home, "%u", localUser, "%h", t.hostname, "%r", t.user, "%%", "%")
		return r.Replace(p)
	}
	switch ids := getAll("IdentityFile"); {
	case len(o.IdentityFiles) > 0:
		for _, p := range o.IdentityFiles {
			t.identities = append(t.identities, expand(p))
		}
	case len(ids) > 0:
		for _, p := range ids {
			t.identities = append(t.identities, expand(p))
		}
	default:
		t.defaultIdentities = true
		for _, n := range []string{"id_ed25519", "id_ecdsa", "id_rsa"} {
			t.identities = append(t.identities, filepath.Join(home, ".ssh", n))
		}
	}

	if pj := get("ProxyJump"); pj != "" && pj != "none" {
		if depth >= maxJumps {
			return t, fmt.Errorf("ProxyJump chain longer than %d hops (a loop in the ssh config?)", maxJumps)
		}
		for _, hop := range strings.Split(pj, ",") {
			hop = strings.TrimSpace(strings.TrimPrefix(hop, "ssh://"))
			jo := o
			jo.Host, jo.Port, jo.User, jo.Netcat = hop, 0, "", false
			jt, err := resolveDepth(jo, depth+1)
			if err != nil {
				return t, fmt.Errorf("ProxyJump %s of %s: %w", hop, spec, err)
			}
			t.jumps = append(t.jumps, &Factory{o: jo, t: jt})
		}
	}
	return t, nil
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
