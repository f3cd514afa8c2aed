package docs

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// The session's helpers, defined before the first example. A command an
// example starts in the background (cmd &) is followed by __vlink_wait,
// which returns once its ports listen, as a reader would wait before the
// next line: without it a script would race the server it just started.
const prologue = `set -eo pipefail
ip link set lo up

# __vlink_wait PID PORT...: until every PORT listens (TCP; udp:PORT for
# UDP), while PID runs.
__vlink_wait() {
	local pid=$1 i p all
	shift
	for i in $(seq 600); do
		all=1
		for p in "$@"; do
			case $p in
			udp:*) [ -n "$(ss -Hlun "sport = :${p#udp:}")" ] || all=0 ;;
			*) [ -n "$(ss -Hltn "sport = :$p")" ] || all=0 ;;
			esac
		done
		[ $all = 1 ] && return 0
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "example: the command started in the background exited before listening on port(s) $*" >&2
			return 1
		fi
		sleep 0.05
	done
	echo "example: nothing listens on port(s) $* after 30 s" >&2
	return 1
}

# __vlink_forward_ports FILE: the ports of the listen = "HOST:PORT" keys
# of a --forwards FILE.
__vlink_forward_ports() {
	sed -n 's/^listen *= *"[^"]*:\([0-9][0-9]*\)".*/\1/p' "$1"
}

# __vlink_done N: example N ran to its end; what it left in the checkout.
__vlink_done() {
	git status --porcelain --untracked-files=all >"$VLINK_OUT/$1.status"
}
`

var (
	heredocRE    = regexp.MustCompile(`<<-?\s*(['"]?)([A-Za-z_][A-Za-z0-9_]*)(['"]?)`)
	listenFlagRE = regexp.MustCompile(`--(?:listen|metrics)[= ](\S+)`)
	httpServerRE = regexp.MustCompile(`http\.server\s+(\d+)`)
	iperfRE      = regexp.MustCompile(`iperf3\s+-s\b.*?\s-p\s*(\d+)`)
	socatUDPRE   = regexp.MustCompile(`socat\s.*\bUDP[46]?-(?:RECVFROM|LISTEN):(\d+)`)
	dnsmasqRE    = regexp.MustCompile(`dnsmasq\s.*--port[= ](\d+)`)
	udpFlagRE    = regexp.MustCompile(`\s--udp\b`)
	forwardsRE   = regexp.MustCompile(`--forwards[= ](\S+)`)
)

// script turns the examples into one bash session: each example's block
// as written, its standard output and error kept apart
// ($VLINK_OUT/N.out, N.err), a wait after each background command, and
// __vlink_done once it ended.
func script(examples []example) (string, error) {
	var b strings.Builder
	b.WriteString(prologue)
	for n, e := range examples {
		body, err := withWaits(e)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "\n# example %d: %s\n{\n%s} >\"$VLINK_OUT/%d.out\" 2>\"$VLINK_OUT/%d.err\"\n__vlink_done %d\n", n, e, body, n, n, n)
	}
	b.WriteString("\ncommand -v vlink >\"$VLINK_OUT/which\"\n")
	return b.String(), nil
}

// withWaits returns the example's text with a __vlink_wait after every
// command it sends to the background, for the ports the command names.
func withWaits(e example) (string, error) {
	var (
		b       strings.Builder
		cmd     []string // the lines of the command being read
		heredoc string   // the delimiter whose line ends the here-document
	)
	for i, line := range strings.Split(strings.TrimSuffix(e.text, "\n"), "\n") {
		b.WriteString(line + "\n")
		if heredoc != "" {
			if line == heredoc {
				heredoc = ""
			}
			continue
		}
		code := stripComment(line)
		if m := heredocRE.FindStringSubmatch(code); m != nil {
			heredoc = m[2]
		}
		cmd = append(cmd, code)
		if strings.HasSuffix(strings.TrimSpace(code), "\\") {
			continue
		}
		whole := strings.TrimSpace(strings.Join(cmd, " "))
		cmd = nil
		if !strings.HasSuffix(whole, "&") || strings.HasSuffix(whole, "&&") {
			continue
		}
		ports := backgroundPorts(whole)
		if len(ports) == 0 {
			return "", fmt.Errorf("%s:%d: %q runs in the background, but names no port to wait for (--listen, --metrics, http.server PORT, iperf3 -s -p PORT, socat UDP-RECVFROM:PORT, dnsmasq --port PORT, --forwards FILE)", e.doc, e.line+1+i, whole)
		}
		fmt.Fprintf(&b, "__vlink_wait $! %s\n", strings.Join(ports, " "))
	}
	return b.String(), nil
}

// backgroundPorts lists the ports a server command listens on, as bash
// words.
func backgroundPorts(cmd string) []string {
	var ports []string
	udp := "" // vlink tunnel --udp listens on UDP
	if udpFlagRE.MatchString(cmd) {
		udp = "udp:"
	}
	for _, m := range listenFlagRE.FindAllStringSubmatch(cmd, -1) {
		addr := strings.Trim(m[1], `'"`)
		if i := strings.LastIndexByte(addr, ':'); i >= 0 {
			ports = append(ports, udp+addr[i+1:])
		}
	}
	for _, re := range []*regexp.Regexp{socatUDPRE, dnsmasqRE} {
		for _, m := range re.FindAllStringSubmatch(cmd, -1) {
			ports = append(ports, "udp:"+m[1])
		}
	}
	for _, re := range []*regexp.Regexp{httpServerRE, iperfRE} {
		for _, m := range re.FindAllStringSubmatch(cmd, -1) {
			ports = append(ports, m[1])
		}
	}
	for _, m := range forwardsRE.FindAllStringSubmatch(cmd, -1) {
		ports = append(ports, fmt.Sprintf("$(__vlink_forward_ports %s)", m[1]))
	}
	return ports
}

// stripComment cuts a shell comment off a line: a # that starts a word
// outside quotes.
func stripComment(line string) string {
	var single, double, escaped bool
	for i, r := range line {
		switch {
		case escaped:
			escaped = false
		case r == '\\' && !single:
			escaped = true
		case r == '\'' && !double:
			single = !single
		case r == '"' && !single:
			double = !double
		case r == '#' && !single && !double && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return strings.TrimRight(line[:i], " \t")
		}
	}
	return line
}

func TestStripComment(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"python3 -m http.server 8000 &   # any TCP server", "python3 -m http.server 8000 &"},
		{"# a comment", ""},
		{`curl -w '%{http_code} #1\n' x # count`, `curl -w '%{http_code} #1\n' x`},
		{`echo "a # b" c#d`, `echo "a # b" c#d`},
		{`echo \# not`, `echo \# not`},
	} {
		if got := stripComment(tc.line); got != tc.want {
			t.Errorf("stripComment(%q) = %q, want %q", tc.line, got, tc.want)
		}
	}
}

func TestWithWaits(t *testing.T) {
	e := example{doc: "x.md", line: 1, text: `iperf3 -s -p 5201 &
python3 -m http.server 8000 --bind 127.0.0.1 &   # any server
vlink serve --listen 127.0.0.1:7000 \
    --target 127.0.0.1:8000 --metrics 127.0.0.1:9464 &
cat > f.toml <<'EOF'
listen = "127.0.0.1:8085"
a &
EOF
vlink tunnel --forwards f.toml &
socat UDP4-RECVFROM:5300,bind=127.0.0.1,fork PIPE &
vlink tunnel --udp --listen 127.0.0.1:5301 --to x:53 &
dnsmasq --keep-in-foreground --port 5303 \
    --no-hosts &
pid=$!
curl x && curl y
`}
	got, err := withWaits(e)
	if err != nil {
		t.Fatal(err)
	}
	want := `iperf3 -s -p 5201 &
__vlink_wait $! 5201
python3 -m http.server 8000 --bind 127.0.0.1 &   # any server
__vlink_wait $! 8000
vlink serve --listen 127.0.0.1:7000 \
    --target 127.0.0.1:8000 --metrics 127.0.0.1:9464 &
__vlink_wait $! 7000 9464
cat > f.toml <<'EOF'
listen = "127.0.0.1:8085"
a &
EOF
vlink tunnel --forwards f.toml &
__vlink_wait $! $(__vlink_forward_ports f.toml)
socat UDP4-RECVFROM:5300,bind=127.0.0.1,fork PIPE &
__vlink_wait $! udp:5300
vlink tunnel --udp --listen 127.0.0.1:5301 --to x:53 &
__vlink_wait $! udp:5301
dnsmasq --keep-in-foreground --port 5303 \
    --no-hosts &
__vlink_wait $! udp:5303
pid=$!
curl x && curl y
`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if _, err := withWaits(example{doc: "x.md", line: 1, text: "sleep 100 &\n"}); err == nil {
		t.Error("a background command with no port: no error")
	}
}
