#!/usr/bin/env bash
# Connect to the first byte of the answer of a short request over a 50 ms
# lab link, for an encrypted vlink dial to a gateway against plain TCP and
# TLS 1.3, in the same run (issue 40, point 5: an encrypted dial costs at
# most 2 round trips to the first byte). Clients in the lab's client
# namespace, servers in its server namespace, the delay line between:
#
#   tcp             curl http straight to python3's http.server (1 KiB
#                   file): TCP handshake + request, about 2 RTT
#   tls1.3          curl https (TLS 1.3 only, a fresh process each time, so
#                   no resumption) to the same server wrapped in TLS 1.3
#                   with a self-signed certificate: about 3 RTT
#   vlink-S         curl http to a local `vlink tunnel --stack S --via`
#                   the `vlink serve --key-file --identity` in front of the
#                   http server, with the key: the dialer adds noise below the
#                   stack's layers since the gateway is remote (identity
#                   becomes identity+noise, zstd zstd+noise, tcp noise+tcp).
#                   --via needs --stack, so the lightest filter, identity,
#                   stands for "the default". The gateway's identity lets
#                   it take early data: the tunnel sends curl's request
#                   with the hello (--early-wait)
#   vlink-S@base    the same through BASE's tunnel and serve (with BASE set)
#
# Each round runs every route once, N fetches each (a new curl process and
# a new connection every time), the order rotating from round to round;
# one untimed fetch per route first. The body's SHA-256 is checked on
# every fetch. Per route it prints the median over rounds of each round's
# median curl time_starttransfer (and the rounds' min..max), that in round
# trips of the path (each round's median TCP handshake of the tcp route,
# curl's time_connect: one RTT measured through the same delay line), the
# median over rounds of the ratios to tcp and to tls1.3 of the same round,
# and the CPU seconds of the vlink processes (tunnel and serve) per 1,000
# connections, summed over every round: at 100 ticks a second a round of
# 30 connections is too few to count alone.
#
# Target (issue 40, point 5): each vlink route of this build takes two
# round trips to the first byte, as TCP does: at most TCP's figure of the
# same run (a little over 2.0, the server's time) plus 0.25 RTT.
#
# Needs root (network namespaces), curl, openssl and python3. Environment:
# PROFILE (default wan50-clean: 1 Gbit/s, 50 ms RTT, no loss), N (default
# 30), ROUNDS (default 3), STACKS (vlink stacks, default "identity zstd
# tcp"), VLINK and VLINK_LAB (binaries; default: built from this
# checkout), BASE (another vlink binary: before and after in one run).
PROFILE=${PROFILE:-wan50-clean}
N=${N:-30}
ROUNDS=${ROUNDS:-3}
STACKS=${STACKS:-"identity zstd tcp"}
. "$(dirname "$0")/lib.sh"
# Leave through lib.sh's EXIT trap on a signal too (the lab, its processes
# and the work folder go): once in testing, a SIGTERM that came while bash
# waited for a fetch did not end the script without this.
trap 'exit 130' INT
trap 'exit 143' TERM
need_root "network namespaces"
need curl openssl python3
build_vlink
build_vlink_lab

lab_up_web "$PROFILE"
# The certificate names the server's address, so curl verifies it as a
# real client would (a P-256 key, the usual choice for a web server).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
  -subj "/CN=$server" -addext "subjectAltName=IP:$server" \
  -keyout "$work/tls.key" -out "$work/tls.pem" 2>/dev/null
# The same server as the tcp route's, wrapped in TLS 1.3 only; the
# handshake runs in accept, which is fine for one client at a time.
cat >"$work/https.py" <<'PY'
import functools, http.server, ssl, sys
port, root, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_3
ctx.load_cert_chain(cert, key)
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
httpd = http.server.ThreadingHTTPServer(("0.0.0.0", port), handler)
httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
httpd.serve_forever()
PY

# lab_start's pids are the processes themselves (the lab shares the
# machine's pid namespace): cleanup stops them before the lab goes down.
pids+=("$(lab_start server python3 -m http.server 8000 --bind 0.0.0.0 --directory "$work/www")")
pids+=("$(lab_start server python3 "$work/https.py" 8443 "$work/www" "$work/tls.pem" "$work/tls.key")")
lab_wait_port server 8000
lab_wait_port server 8443

curl=(curl -q -s --noproxy '*' -o "$work/got" -w '%{time_connect} %{time_starttransfer}')
declare -A url=([tcp]="http://$server:8000/small" [tls1.3]="https://$server:8443/small")
declare -A opts=([tls1.3]="--tlsv1.3 --tls-max 1.3 --cacert $work/tls.pem")
declare -A procs=()
routes=(tcp tls1.3)

# vlink_routes BINARY SUFFIX SERVE_PORT FIRST_TUNNEL_PORT starts one
# binary's serve and a tunnel per stack of STACKS, and defines its routes.
vlink_routes() {
  local bin=$1 sfx=$2 sp=$3 tp=$4 s gw t
  gw=$(lab_start server "$bin" serve --listen "$server:$sp" --key-file "$work/key" --identity "$work/identity" --allow 127.0.0.1:8000 --log-level warn)
  pids+=("$gw")
  lab_wait_port server "$sp"
  for s in $STACKS; do
    t=$(lab_start client "$bin" tunnel --listen "127.0.0.1:$tp" --via "$server:$sp" --to 127.0.0.1:8000 \
      --stack "$s" --key-file "$work/key" --known-nodes none --log-level warn)
    pids+=("$t")
    lab_wait_port client "$tp"
    url[vlink-$s$sfx]="http://127.0.0.1:$tp/small"
    procs[vlink-$s$sfx]="$t $gw"
    routes+=("vlink-$s$sfx")
    tp=$((tp + 1))
  done
}
started=$SECONDS # the gateways' start: see the wait before round 1
vlink_routes "$VLINK" "" 7000 8300
[ -z "${BASE:-}" ] || vlink_routes "$BASE" @base 7001 8400
n=${#routes[@]}
hz=$(getconf CLK_TCK)

fetch() { # route round: one fetch, its times appended to the results
  local t got
  # shellcheck disable=SC2086 # opts is a word list
  t=$(lab client "${curl[@]}" ${opts[$1]:-} "${url[$1]}") || { echo "$1: curl failed" >&2; exit 1; }
  got=$(sha256sum <"$work/got" | cut -d' ' -f1)
  [ "$got" = "$want" ] || { echo "$1: round $2 fetched something else" >&2; exit 1; }
  echo "$2 $1 $t" >>"$work/fetches"
}

env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $("$VLINK" version); $(curl --version | head -1 | cut -d' ' -f1-2,5); $PROFILE"
echo "$env_line" >&2
: >"$work/fetches"
: >"$work/cpu"
for route in "${routes[@]}"; do fetch "$route" 0; done # warm-up, round 0: not reported
# A gateway takes early data only in first flights dated 10 s (the replay
# window) after its start: before, it drops them and the tunnel sends the
# request again after the handshake, a round trip later (ARCHITECTURE §2,
# "Early data"). Measure a gateway that has been up for a while.
while ((SECONDS - started < 12)); do sleep 1; done
for round in $(seq "$ROUNDS"); do
  for i in $(seq 0 $((n - 1))); do
    route=${routes[$(( (i + round) % n ))]}
    before=0 after=0
    # shellcheck disable=SC2086 # word lists on purpose
    [ -n "${procs[$route]:-}" ] && before=$(cpu_ticks ${procs[$route]})
    for _ in $(seq "$N"); do fetch "$route" "$round"; done
    # shellcheck disable=SC2086
    [ -n "${procs[$route]:-}" ] && after=$(cpu_ticks ${procs[$route]})
    echo "$route $((after - before))" >>"$work/cpu"
    echo "round $round $route: median $(awk -v r="$round" -v p="$route" '$1 == r && $2 == p { print $4 * 1000 }' "$work/fetches" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }') ms" >&2
  done
done

echo "$env_line"
python3 - "$work/fetches" "$work/cpu" "$N" "$ROUNDS" "$hz" "${routes[@]}" <<'PY'
import collections, statistics, sys
import targets
fetches, cpu_path, n, rounds, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
order = sys.argv[6:]
start = collections.defaultdict(lambda: collections.defaultdict(list))
conn = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(fetches):
    rnd, route, c, s = line.split()
    if rnd == "0":
        continue
    conn[route][int(rnd)].append(float(c) * 1000)
    start[route][int(rnd)].append(float(s) * 1000)
ticks = collections.Counter()
for line in open(cpu_path):
    route, t = line.split()
    ticks[route] += int(t)
rnds = sorted(start["tcp"])
med = {route: {r: statistics.median(start[route][r]) for r in rnds} for route in order}
rtt = {r: statistics.median(conn["tcp"][r]) for r in rnds}
def wire(route):
    s = route.split("@")[0]
    if not s.startswith("vlink-"):
        return {"tcp": "http", "tls1.3": "https, TLS 1.3"}[s]
    s = s[len("vlink-"):]
    return "noise+tcp" if s == "tcp" else s + "+noise"
def per_round(route, f):
    return [f(r) for r in rnds]
def m(xs):
    return statistics.median(xs)
rt = lambda route: per_round(route, lambda r: med[route][r] / rtt[r])
print(f"connect to the first byte of a 1 KiB HTTP answer, {n} fetches per route and round, {rounds} rounds interleaved")
print(f"RTT of the path (the tcp route's TCP handshake): median {m(rtt.values()):.1f} ms ({min(rtt.values()):.1f}..{max(rtt.values()):.1f})")
print(f"  {'route':<20} {'on the wire':<15} {'TTFB ms: median (min..max)':>27} {'RTTs':>5} {'/ tcp':>6} {'/ tls1.3':>8} {'CPU s / 1k conns':>17}")
for route in order:
    xs = list(med[route].values())
    cpu = f"{ticks[route] / hz / (n * rounds) * 1000:17.2f}" if route.startswith("vlink-") else f"{'':17}"
    print(f"  {route:<20} {wire(route):<15} {f'{m(xs):.1f} ({min(xs):.1f}..{max(xs):.1f})':>27} {m(rt(route)):5.2f}"
          f" {m(per_round(route, lambda r: med[route][r] / med['tcp'][r])):6.2f}"
          f" {m(per_round(route, lambda r: med[route][r] / med['tls1.3'][r])):8.2f} {cpu}")
twins = [r for r in order if r + "@base" in med]
if twins:
    print("  before and after in the same rounds: TTFB, this build / BASE, median of the rounds (min..max)")
    for route in twins:
        x = per_round(route, lambda r: med[route][r] / med[route + "@base"][r])
        print(f"    {route:<18} {m(x):.2f} ({min(x):.2f}..{max(x):.2f})")
for route in order:
    if route.startswith("vlink-") and not route.endswith("@base"):
        # Two round trips, as TCP's own: TCP's TTFB is a little more
        # than 2 RTT (the server's time), so the line is TCP's figure of
        # the same run plus a quarter of a round trip for vlink's time.
        targets.check(f"{route}: round trips to the first byte, TCP's + 0.25 (issue 40, point 5)", m(rt(route)), "<=", round(m(rt("tcp")) + 0.25, 2), " RTT")
PY
