package vlink_test

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/factories/socks"
	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// The secrets these tests write are made of distinctive pieces, joined by
// the characters that cut a stack's text or a URL (/ # ? + , @ : % =), so
// that a message holding any part of one is caught. Al1ce is a proxy
// URL's user name: user-info too.
var secretPieces = []string{"Al1ce", "S3cret", "Qu1x", "Zy9", "Wv8", "Kp7"}

// secretPasswords are passwords as users paste them, raw.
var secretPasswords = []string{
	"S3cret",
	"S3cret/Qu1x#Zy9?Wv8+Kp7",
	"S3cret,Qu1x", "S3cret,qu1x", "S3cret,qu1x=Zy9",
	"S3cret+Qu1x", "S3cret+qu1x", "S3cret+tcp:Qu1x=1", "1080+Qu1x", "1080+Qu1x+Zy9",
	"S3cret@Qu1x", "S3cret:Qu1x", "S3cret%zzQu1x", "S3cret%2", "S3cret Qu1x",
}

// secretStacks are stack texts with a password (%[1]s) in every place a
// user may write one, well-formed or not.
var secretStacks = []string{
	"socks5://Al1ce:%[1]s@proxy.example:1080",
	"zstd+socks5h://Al1ce:%[1]s@proxy.example+tcp",
	"socks5h://Al1ce:%[1]s@proxy.example:1080+ssh:host=bastion",
	"http://Al1ce:%[1]s@proxy.example",
	"http://Al1ce:%[1]s@proxy.example:3128/path",
	"socks4://Al1ce:%[1]s@proxy.example",
	"socks5://Al1ce:%[1]s",
	"socks5://%[1]s@proxy.example:1080",
	"ftp://Al1ce:%[1]s@proxy.example",
	"tcp+socks5://Al1ce:%[1]s@proxy.example",
	"zstd:password=%[1]s",
	"zstd:password=%[1]s,level=3",
	"socks5:addr=proxy.example:1080,user=Al1ce,password=%[1]s",
	"socks5:addr=proxy.example:1080,user=Al1ce,password=%[1]s,resolve=sideways",
	"socks5:addr=proxy.example:1080,user=Al1ce,pasword=%[1]s",
	"socks5:addr=proxy.example:1080,pw=%[1]s",
	"socks5:user=Al1ce,password=%[1]s",
	"socks5:password=%[1]s,password=%[1]s",
	"http:addr=proxy.example:3128,user=Al1ce,password=%[1]s,password-env=HOME",
	"zstd:pwd=%[1]s+tcp",
	"nosuch:token=%[1]s",
	"ssh:host=bastion,passwd=%[1]s",
	"ssh:host=bastion,identity=/k,api-key=%[1]s",
	" socks5:addr=proxy.example:1080,password=%[1]s",
	"socks5:Addr=proxy.example:1080,password=%[1]s",
	"socks5:addr=proxy.example:1080,password=%[1]s+zstd",
}

// indistinguishable are texts in which nothing can tell a secret from
// what it is not: a URL whose user left out "@host" and whose password
// holds an '@' reads as user:password@host, well-formed.
var indistinguishable = map[string]bool{
	"socks5://Al1ce:S3cret@Qu1x": true,
}

// checkMessage checks that msg shows no secret and says each of want.
func checkMessage(t *testing.T, msg string, want []string) {
	t.Helper()
	if leaked(msg) != nil {
		t.Errorf("error shows %q: %s", leaked(msg), msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("error does not say %q: %s", w, msg)
		}
	}
}

// leaked returns the pieces of a secret that s holds.
func leaked(s string) []string {
	var out []string
	for _, p := range secretPieces {
		if strings.Contains(strings.ToLower(s), strings.ToLower(p)) {
			out = append(out, p)
		}
	}
	return out
}

// TestParseHidesSecrets: whatever a stack's text, and wherever a secret
// sits in it, neither Parse's error nor the parsed stack's String nor
// the redacted text shows any part of it.
func TestParseHidesSecrets(t *testing.T) {
	for _, tmpl := range secretStacks {
		for _, pw := range secretPasswords {
			text := fmt.Sprintf(tmpl, pw)
			if indistinguishable[text] {
				continue
			}
			t.Run(text, func(t *testing.T) {
				if got := secret.RedactStack(text); leaked(got) != nil {
					t.Errorf("RedactStack = %q: shows %q", got, leaked(got))
				}
				s, err := vlink.Parse(text)
				if err != nil {
					if msg := err.Error(); leaked(msg) != nil {
						t.Errorf("Parse error shows %q: %s", leaked(msg), msg)
					}
					return
				}
				for _, shown := range []string{s.String(), fmt.Sprint(s), fmt.Sprint(s.Layers)} {
					if leaked(shown) != nil {
						t.Errorf("parsed stack shows %q: %s", leaked(shown), shown)
					}
				}
			})
		}
	}
}

// TestParseErrorsSayWhatIsWrong: an error that hides a secret still
// names the layer and what to fix.
func TestParseErrorsSayWhatIsWrong(t *testing.T) {
	for _, tc := range []struct {
		text string
		want []string
	}{
		{"zstd:password=S3cret", []string{"layer 1 (zstd)", `unknown parameter "password"`, "password=REDACTED"}},
		{"socks5://Al1ce:S3cret/Qu1x#Zy9?Wv8+Kp7@proxy.example:1080", []string{"layer 1 (socks5)", "percent-encode", "%2F", "%23", "%3F", "%2B"}},
		{"socks5://Al1ce:S3cret/Qu1x@proxy.example:1080", []string{"layer 1 (socks5)", "socks5://REDACTED@proxy.example:1080", "percent-encode"}},
		{"socks5://Al1ce:S3cret@proxy.example:bad", []string{"layer 1 (socks5)", `invalid port ":bad"`}},
		{"socks5://Al1ce:1080+Qu1x@proxy.example:1080", []string{"layer 1 (socks5)", "%2B"}},
		{"socks5:addr=proxy.example:1080,password=S3cret,Qu1x", []string{"layer 1 (socks5)", "password", "%2C"}},
		{"socks5:addr=proxy.example:1080,password=S3cret,qu1x=Zy9", []string{"layer 1 (socks5)", "password", "%2C"}},
		{"socks5:addr=proxy.example:1080,password=S3cret+Qu1x", []string{"layer 2", "layer 1", "%2B"}},
		{"socks5:addr=proxy.example:1080,pasword=S3cret", []string{"layer 1 (socks5)", `unknown parameter "pasword"`}},
		{"socks5:addr=proxy.example:1080,pw=S3cret", []string{"layer 1 (socks5)", `unknown parameter "pw"`}},
		{"socks5:addr=proxy.example:1080,password=S3cret%zz", []string{"layer 1 (socks5)", "password", "escape"}},
		{"http://Al1ce:S3cret@proxy.example", []string{"layer 1 (http)", "needs its port"}},
		{"socks4://Al1ce:S3cret@proxy.example", []string{"layer 1 (socks4)", "SOCKS4 has no passwords"}},
		{"nosuch:token=S3cret", []string{"layer 1 (nosuch)", "unknown layer", "token=REDACTED"}},
	} {
		t.Run(tc.text, func(t *testing.T) {
			_, err := vlink.Parse(tc.text)
			if err == nil {
				t.Fatal("parsed")
			}
			msg := err.Error()
			checkMessage(t, msg, tc.want)
			var se *vlink.StackError
			if !errors.As(err, &se) {
				t.Errorf("error %v is not a *StackError", err)
			}
		})
	}
}

// TestFromConfigHidesSecrets: a structured stack's error shows no value
// its layer's schema does not know, misspelled names included.
func TestFromConfigHidesSecrets(t *testing.T) {
	_, err := vlink.FromConfig([]vlink.LayerConfig{{Layer: "socks5", Params: map[string]any{"addr": "proxy.example:1080", "pasword": "S3cret"}}})
	if err == nil {
		t.Fatal("accepted")
	}
	if msg := err.Error(); leaked(msg) != nil || !strings.Contains(msg, `unknown parameter "pasword"`) {
		t.Errorf("error %q: want it to name pasword and not show its value", msg)
	}
}

// TestConfigHidesSecrets: the config file's and the environment's errors
// say where the problem is (the file's line, the key) without a secret.
func TestConfigHidesSecrets(t *testing.T) {
	const url = `socks5://Al1ce:S3cret/Qu1x@proxy.example:1080`
	const good = `socks5://Al1ce:S3cret@proxy.example:1080`
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", dir)
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"unknown key", "[[route]]\nhost = \"x\"\nstak = \"" + url + "\"\n", []string{"c.toml:3", `unknown key "route.stak"`}},
		{"unknown key by a secret", "[[route]]\nhots = \"x\"\nstack = \"" + good + "\"\n", []string{"c.toml:2", `unknown key "route.hots"`}},
		{"unknown top-level key", "pasword = \"S3cret\"\n", []string{"c.toml:1", `unknown key "pasword"`}},
		{"bad escape in a secret", "[[route]]\nhost = \"x\"\nstack = \"socks5://Al1ce:S3cret\\Qu1x@proxy.example:1080\"\n", []string{"c.toml:3:"}},
		{"broken URL", "[[route]]\nhost = \"x\"\nstack = \"" + url + "\"\n", []string{"route 1", "percent-encode"}},
		{"broken URL, default", "[default]\nstack = \"" + url + "\"\n", []string{"default route", "percent-encode"}},
		{"secret in a misspelled parameter", "[[route]]\nhost = \"x\"\nstack = \"socks5:addr=p:1,pasword=S3cret\"\n", []string{"route 1", `"pasword"`}},
		{"structured", "[[route]]\nhost = \"x\"\nlayers = [{layer = \"socks5\", params = {addr = \"p:1\", pw = \"S3cret\"}}]\n", []string{"route 1", `"pw"`}},
		{"try given twice", "[[route]]\nhost = \"x\"\ntry = [\"direct\", \"" + good + "\", \"" + good + "\"]\n", []string{"rule 1", "given twice"}},
		{"proxy URL as via", "[[route]]\nhost = \"x\"\nstack = \"zstd\"\nvia = \"" + good + "\"\n", []string{"rule 1", "via"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, dir, "c.toml", tc.file, 0o600)
			_, err := vlink.LoadConfig(p)
			if err == nil {
				t.Fatal("loaded")
			}
			msg := err.Error()
			checkMessage(t, msg, tc.want)
		})
	}
	t.Run("VLINK_STACK", func(t *testing.T) {
		t.Setenv(vlink.EnvConfig, "")
		for _, text := range []string{"zstd:password=S3cret", url, "socks5:addr=p:1,password=S3cret,Qu1x"} {
			t.Setenv(vlink.EnvStack, text)
			_, err := vlink.ConfigFromEnv()
			if err == nil {
				t.Fatalf("%s: accepted", text)
			}
			if msg := err.Error(); leaked(msg) != nil || !strings.Contains(msg, vlink.EnvStack) {
				t.Errorf("error shows %q, or does not name %s: %s", leaked(msg), vlink.EnvStack, msg)
			}
		}
	})
}

// TestBestEffortHidesSecrets: the ways a best-effort dial tried, in its
// error, its report and the connection's path, show no secret.
func TestBestEffortHidesSecrets(t *testing.T) {
	closed := testnet.RefusedAddr(t)
	dial := func(t *testing.T, try ...string) (net.Conn, *vlink.RouteReport, error) {
		t.Helper()
		cfg, err := vlink.NewConfig([]selector.Rule{{Host: "127.0.0.1", Try: try}}, selector.Rule{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if s := cfg.String(); leaked(s) != nil {
			t.Errorf("config listing shows %q: %s", leaked(s), s)
		}
		return (&vlink.Dialer{Config: cfg}).DialReport(t.Context(), "tcp", testnet.EchoServer(t))
	}
	check := func(t *testing.T, rep *vlink.RouteReport) {
		t.Helper()
		for _, s := range append([]string{rep.Rule, rep.Way, rep.Path}, attemptWays(rep)...) {
			if leaked(s) != nil {
				t.Errorf("report shows %q: %s", leaked(s), s)
			}
		}
	}
	t.Run("none won", func(t *testing.T) {
		c, rep, err := dial(t, "socks5://Al1ce:S3cret@"+closed, "test-at:addr="+closed)
		if err == nil {
			c.Close()
			t.Fatalf("dialed %s, which refuses", closed)
		}
		if msg := err.Error(); leaked(msg) != nil || !strings.Contains(msg, "socks5://REDACTED@"+closed) {
			t.Errorf("error shows %q, or not the way: %s", leaked(msg), msg)
		}
		check(t, rep)
	})
	t.Run("won", func(t *testing.T) {
		proxy := testnet.Listen(t, func(c net.Conn) {
			out, _, err := (&socks.Server{Dialer: &net.Dialer{}}).Handshake(t.Context(), c)
			if err == nil {
				netconn.Relay(c, out)
			}
		})
		c, rep, err := dial(t, "socks5://Al1ce:S3cret@"+proxy)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if p := vlink.PathOf(c); leaked(p) != nil || p == "" {
			t.Errorf("PathOf = %q", p)
		}
		check(t, rep)
	})
}

func attemptWays(rep *vlink.RouteReport) []string {
	var ways []string
	for _, a := range rep.Attempts {
		ways = append(ways, a.Way)
	}
	return ways
}
