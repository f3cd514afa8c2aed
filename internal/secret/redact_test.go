package secret_test

import (
	"testing"

	"github.com/vlink-dev/vlink/internal/secret"
	_ "github.com/vlink-dev/vlink/vlink/layers" // RedactStack shows what the layers' schemas know
)

func TestRedactStack(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"zstd:level=3+tcp", "zstd:level=3+tcp"},
		{"zstd:level=3,fast", "zstd:level=3,fast"},
		{"zstd+socks5:addr=p:1080,user=u,password=hunter2", "zstd+socks5:addr=p:1080,user=REDACTED,password=REDACTED"},
		{"socks5:addr=p:1080,user=u,password-file=/pw", "socks5:addr=p:1080,user=REDACTED,password-file=/pw"},
		{"ssh:host=x,user=bob,identity=/k,psk=hunter2", "ssh:host=x,user=bob,identity=/k,psk=REDACTED"},
		// A name the schema does not know may hold anything.
		{"zstd:levl=3", "zstd:levl=REDACTED"},
		{"socks5:addr=p:1,pasword=hunter2,resolve=local", "socks5:addr=p:1,pasword=REDACTED,resolve=local"},
		{"nosuch:a=1,b=2+zstd", "nosuch:a=REDACTED+zstd"},
		// A raw ',' or '+' cuts a value where the parser does: what
		// follows, up to a parameter or layer the schemas know, may be
		// the rest of it.
		{"socks5:addr=p:1,password=S3cret,Qu1x,resolve=local", "socks5:addr=p:1,password=REDACTED,resolve=local"},
		{"socks5:addr=p:1,password=S3cret,qu1x=y", "socks5:addr=p:1,password=REDACTED"},
		{"zstd:password=S3cret+Qu1x+tcp", "zstd:password=REDACTED+tcp"},
		{"zstd:password=S3cret+tcp:Qu1x=1+tcp", "zstd:password=REDACTED+tcp"},
		// All of a proxy URL's user-info, the user name too.
		{"zstd+socks5h://alice:hunter2@proxy:1080", "zstd+socks5h://REDACTED@proxy:1080"},
		{"http://bob:hu%2Bnter2@proxy:3128", "http://REDACTED@proxy:3128"},
		{"socks5h://alice@proxy", "socks5h://REDACTED@proxy"},
		{"socks5h://proxy:1080+ssh:host=bastion", "socks5h://proxy:1080+ssh:host=bastion"},
		{"socks5://a:hunter2@[::1", "socks5://REDACTED@[::1"},
		{"socks5://u:S3cret/Qu1x#Zy9?Wv8@proxy:1080", "socks5://REDACTED@proxy:1080"},
		// ... which ends at the last '@' a raw '+' may have cut off.
		{"socks5://u:S3cret/Qu1x#Zy9?Wv8+Kp7@proxy:1080", "socks5://REDACTED@proxy:1080"},
		{"socks5://u:1080+Qu1x@proxy:1080+tcp", "socks5://REDACTED@proxy:1080+tcp"},
		{"socks5://u:1080+Qu1x+Zy9@proxy:1080", "socks5://REDACTED@proxy:1080"},
		// A URL that does not parse, without an '@', may be a password
		// that lost its host: where it ends is unknown.
		{"socks5://u:S3cret", "socks5://REDACTED"},
		{"socks5://u:S3cret+Qu1x+tcp", "socks5://REDACTED+tcp"},
		{"socks5://u:1080", "socks5://u:1080"},
		{"socks5://u:1080+Qu1x", "socks5://REDACTED"},
		{"socks5://u:1080+tcp", "socks5://u:1080+tcp"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			if got := secret.RedactStack(tc.in); got != tc.want {
				t.Errorf("RedactStack(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// TestHasPassword: what a warning about passwords on a command line
// calls a password.
func TestHasPassword(t *testing.T) {
	for in, want := range map[string]bool{
		"zstd":                  false,
		"socks5h://alice@proxy": false,
		"socks5:addr=p:1,user=alice,password-file=/p": false,
		"socks5h://alice:hunter2@proxy":               true,
		"socks5h://alice:@proxy":                      true,
		"socks5:addr=p:1,user=alice,password=x":       true,
		"socks5:addr=p:1,pasword=x":                   true,
		"zstd:pw=x":                                   true,
		"ssh:host=x,api-key=x":                        true,
		"socks5://u:S3cret/Qu1x@proxy:1080":           true,
	} {
		t.Run(in, func(t *testing.T) {
			if got := secret.HasPassword(in); got != want {
				t.Errorf("HasPassword(%q) = %t, want %t", in, got, want)
			}
		})
	}
}
