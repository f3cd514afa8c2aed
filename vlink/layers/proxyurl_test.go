package layers_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// TestProxyURLs parses proxy URLs as users paste them where a stack is
// given, and checks the layer each becomes, what String shows of it, and
// that no error quotes a password.
func TestProxyURLs(t *testing.T) {
	for _, tc := range []struct {
		in       string
		want     string // String() of the parsed stack
		password string // the password parameter the layer gets
	}{
		{"socks5h://proxy.example:1080", "socks5:addr=proxy.example:1080,resolve=remote+tcp", ""},
		{"socks5://proxy.example", "socks5:addr=proxy.example:1080,resolve=local+tcp", ""},
		{"zstd+socks5h://alice:hunter2@proxy.example", "zstd+socks5:addr=proxy.example:1080,password=REDACTED,resolve=remote,user=REDACTED+tcp", "hunter2"},
		{"SOCKS5H://alice:p%2Bw%40rd@[::1]:9050", "socks5:addr=[::1]:9050,password=REDACTED,resolve=remote,user=REDACTED+tcp", "p+w@rd"},
		{"socks4://bob@10.0.0.1:1080", "socks4:addr=10.0.0.1:1080,user=REDACTED+tcp", ""},
		{"socks4a://proxy:9050", "socks4a:addr=proxy:9050+tcp", ""},
		{"http://carol:hunter2@proxy:3128/", "http:addr=proxy:3128,password=REDACTED,user=REDACTED+tcp", "hunter2"},
		{"lz4+socks5h://proxy:1080+ssh:host=bastion", "lz4+socks5:addr=proxy:1080,resolve=remote+ssh:host=bastion+tcp", ""},
	} {
		t.Run(tc.in, func(t *testing.T) {
			s, err := vlink.Parse(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
			var pw string
			for _, l := range s.Layers {
				if p, ok := l.Params["password"]; ok {
					pw = p
				}
			}
			if pw != tc.password {
				t.Errorf("password parameter %q, want %q", pw, tc.password)
			}
			if tc.password != "" {
				if _, err := vlink.Parse(s.String()); err != nil {
					t.Errorf("String() does not parse again: %v", err)
				}
			}
		})
	}
	for _, tc := range []struct{ in, want string }{
		{"https://carol:hunter2@proxy:3128", `scheme "https"`},
		{"http://carol:hunter2@proxy", "needs its port"},
		{"socks4://bob:hunter2@proxy", "SOCKS4 has no passwords"},
		{"socks5h://alice:hunter2@proxy:1080/path", "no path"},
		{"socks5h://alice:hunter2@proxy:bad", "invalid port"},
		{"socks5h://alice:hunter2@:1080", "without a host"},
		{"socks5h://alice:hunter2@proxy:1080+socks5h://x:hunter2@[::1", "missing ']'"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			_, err := vlink.Parse(tc.in)
			if err == nil {
				t.Fatal("parsed")
			}
			var se *vlink.StackError
			if !errors.As(err, &se) || !errors.Is(err, vlink.ErrSyntax) {
				t.Errorf("error %v: want a *StackError matching ErrSyntax", err)
			}
			if msg := err.Error(); strings.Contains(msg, "hunter2") || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q: want it to say %q and never the password", msg, tc.want)
			}
		})
	}
}

// TestProxyURLPasswordOrigins: a URL's password and password-file are
// two answers to one question; a stack giving both is refused when its
// layer is built.
func TestProxyURLPasswordOrigins(t *testing.T) {
	_, err := (&vlink.Dialer{Stack: vlink.MustParse("socks5:addr=127.0.0.1:1,user=u,password=a,password-env=HOME")}).Dial("tcp", "127.0.0.1:2")
	if err == nil || !strings.Contains(err.Error(), "give one of") {
		t.Errorf("dial with two password sources: %v", err)
	}
}

// TestProxyFromEnvironment: with the switch on, ALL_PROXY (or
// HTTPS_PROXY) becomes the default route and NO_PROXY's destinations
// and loopback stay direct; with it off, the variables change nothing.
func TestProxyFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", dir) // no user config file
	t.Setenv("VLINK_CONFIG", "")
	for _, v := range []string{"ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "VLINK_STACK", "VLINK_VIA"} {
		t.Setenv(v, "")
	}
	t.Setenv("ALL_PROXY", "socks5h://alice:hunter2@proxy.example:1080")
	t.Setenv("NO_PROXY", "internal.example, .corp.example,10.0.0.0/8,db.example:5432")
	const proxied = "socks5:addr=proxy.example:1080,password=hunter2,resolve=remote,user=alice+tcp"

	t.Setenv(vlink.EnvProxyFromEnvironment, "")
	off, err := vlink.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := off.Selector().Match("example.com:443"); r.Action != selector.Direct {
		t.Errorf("switch off: example.com goes %v, want direct: ALL_PROXY alone must change nothing", r.Action)
	}

	t.Setenv(vlink.EnvProxyFromEnvironment, "1")
	on, err := vlink.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr    string
		proxied bool
	}{
		{"example.com:443", true},
		{"internal.example:80", false},
		{"a.internal.example:80", false},
		{"corp.example:80", true}, // .corp.example: subdomains only
		{"x.corp.example:80", false},
		{"10.1.2.3:22", false},
		{"11.1.2.3:22", true},
		{"db.example:5432", false},
		{"db.example:5433", true},
		{"127.0.0.1:80", false},
		{"[::1]:80", false},
		{"localhost:80", false},
	} {
		r, err := on.Selector().Match(tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Action == selector.Stack && r.Stack == proxied; got != tc.proxied {
			t.Errorf("%s: %v %q, want proxied %v", tc.addr, r.Action, r.Stack, tc.proxied)
		}
	}
	if s := on.String(); strings.Contains(s, "hunter2") || !strings.Contains(s, "REDACTED") {
		t.Errorf("the config's description shows the proxy's password, or no redaction:\n%s", s)
	}

	t.Run("NO_PROXY=*", func(t *testing.T) {
		t.Setenv("NO_PROXY", "*")
		c, err := vlink.ConfigFromEnv()
		if err != nil {
			t.Fatal(err)
		}
		if r, _ := c.Selector().Match("example.com:443"); r.Action != selector.Direct {
			t.Errorf("example.com goes %v, want direct", r.Action)
		}
	})
	t.Run("HTTPS_PROXY, no scheme", func(t *testing.T) {
		t.Setenv("ALL_PROXY", "")
		t.Setenv("HTTPS_PROXY", "proxy.example:3128")
		c, err := vlink.ConfigFromEnv()
		if err != nil {
			t.Fatal(err)
		}
		if r, _ := c.Selector().Match("example.com:443"); r.Stack != "http:addr=proxy.example:3128+tcp" {
			t.Errorf("example.com goes %v %q, want the http proxy", r.Action, r.Stack)
		}
	})
	t.Run("bad proxy URL", func(t *testing.T) {
		t.Setenv("ALL_PROXY", "socks5h://alice:hunter2@proxy.example:1080/x")
		_, err := vlink.ConfigFromEnv()
		if err == nil || !strings.Contains(err.Error(), "ALL_PROXY") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error %v: want it to name ALL_PROXY and never the password", err)
		}
	})
	t.Run("config file switch", func(t *testing.T) {
		t.Setenv(vlink.EnvProxyFromEnvironment, "")
		path := filepath.Join(dir, "on.toml")
		os.WriteFile(path, []byte("proxy_from_environment = true\n[[route]]\nhost = \"*.lan\"\naction = \"refuse\"\n"), 0o600)
		c, err := vlink.LoadConfig(path)
		if err != nil {
			t.Fatal(err)
		}
		if r, _ := c.Selector().Match("example.com:443"); r.Stack != proxied {
			t.Errorf("example.com goes %v %q, want the proxy", r.Action, r.Stack)
		}
		if r, _ := c.Selector().Match("a.lan:1"); r.Action != selector.Refuse {
			t.Errorf("the file's own route lost to the proxy: a.lan goes %v", r.Action)
		}
		both := filepath.Join(dir, "both.toml")
		os.WriteFile(both, []byte("proxy_from_environment = true\n[default]\nstack = \"zstd\"\nvia = \"gw:7000\"\n"), 0o600)
		if _, err := vlink.LoadConfig(both); err == nil || !strings.Contains(err.Error(), "keep one") {
			t.Errorf("a default route and the proxy of the environment: %v, want an error", err)
		}
	})
}
