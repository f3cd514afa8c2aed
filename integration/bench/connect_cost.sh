#!/usr/bin/env bash
# What a connection costs to set up through vlink, measured out of process
# (issue 38, point 12): connlat.c's ttfb mode makes blocking connects to a
# one-byte server on 127.0.0.1 and times each from connect(2) to the first
# byte of the answer, then closes. Routes, all in one run:
#
#   direct            straight to the server (the baseline of each round)
#   haproxy           HAProxy in TCP mode in front of the server
#   tunnel-tcp        vlink tunnel --stack tcp (plain relay: its event loop)
#   tunnel-tcp-gor    the same with --event-loop=false (a goroutine per
#                     connection, as before the event loop)
#   tunnel-zstd       vlink tunnel --stack zstd --via -> vlink serve
#   tunnel-mux        vlink tunnel --stack mux --via -> vlink serve: a new
#                     stream on the session the warm-up connects set up
#   tunnel-via-tcp    vlink tunnel --stack tcp --via -> vlink serve: the
#                     tunnel's goroutines, a quick hello on serve's loop
#   tunnel-via-name   the same to localhost:PORT, a name, which serve's
#                     loop hands to the listener's goroutines: with
#                     tunnel-via-tcp and tunnel-zstd, where a stacked
#                     connect's time goes (serve's goroutine handshake, the
#                     compress layers at both ends)
#   proxychains       proxychains4 (preloaded) -> microsocks
#   exec-tcp          vlink exec, a route through vlink serve with tcp:
#                     the agent makes the first connect, the shim the
#                     others from its recipe (VLINK_PRELOAD_CACHE=0 in the
#                     environment: the agent makes them all)
#   exec-zstd         the same with zstd (the agent relays)
#   exec-mux+lz4      the same with mux+lz4 (streams of one session)
#   exec-agent        vlink exec, a route with tcp and no gateway: the agent
#                     dials the server itself and passes the program the
#                     socket, with a direct recipe, from which the shim
#                     makes the others as the program's own connects
#   exec-agent-ask    the same with VLINK_PRELOAD_CACHE=0: the agent makes
#                     them all (the shim and the agent alone, for exec-tcp's
#                     share of the gateway to be told from theirs)
#
# Each round runs every route once, CONNECTS connects after 20 warm-up
# ones, the order rotating from round to round. A route's figure in a round
# is its median minus direct's median of the same round; the report gives
# the median over rounds and their spread, the ratios to haproxy and to
# proxychains of the same round, and the CPU seconds of the vlink processes
# on the path per 1,000 connections (for exec: the agent, the gateway and
# the client's process with the shim in it, minus the client's own CPU
# without a shim, taken from direct).
#
# Targets (issue 38, point 12): tunnel-tcp <= 1.0x haproxy; tunnel-zstd <=
# 2.0x haproxy; tunnel-mux < tunnel-zstd; exec-tcp and exec-zstd <= 1.0x
# proxychains; exec-mux+lz4 <= 0.5x proxychains.
#
# BASE=/path/to/vlink (a build of another commit) runs every vlink route
# through that binary too, as ROUTE@base, in the same rounds, and prints
# each route's ratio to its @base twin: before and after in one run.
#
# Needs cc, python3, haproxy, proxychains4 and microsocks (integration/deps.sh
# installs them). Environment: CONNECTS (default 1500), ROUNDS (default 5),
# ROUTES (a subset, in this order), VLINK (default: built from the checkout),
# BASE, PORT_BASE (default 25700; uses PORT_BASE+1..+10, with BASE +1..+17).

CONNECTS=${CONNECTS:-1500}
ROUNDS=${ROUNDS:-5}
PORT_BASE=${PORT_BASE:-25700}
. "$(dirname "$0")/lib.sh"
need cc python3 haproxy proxychains4 microsocks
build_vlink
if [ -n "${BASE:-}" ]; then need_ports 17; else need_ports 10; fi
cc -O2 -Wall -Wextra -o "$work/connlat" "$here/connlat.c" -pthread

srv=$(p 1) hap=$(p 2) ttcp=$(p 3) gw=$(p 4) tzstd=$(p 5) tmux=$(p 6) socks=$(p 7)
"$work/connlat" serve "$srv" &
pids+=($!)
cat >"$work/haproxy.cfg" <<CFG
global
  maxconn 4000
defaults
  mode tcp
  timeout connect 5s
  timeout client 30s
  timeout server 30s
listen fwd
  bind 127.0.0.1:$hap
  server s 127.0.0.1:$srv
CFG
haproxy -f "$work/haproxy.cfg" -db >"$work/haproxy.log" 2>&1 &
pids+=($!)
hap_pid=$!
microsocks -i 127.0.0.1 -p "$socks" >/dev/null 2>&1 &
pids+=($!)
socks_pid=$!
printf 'strict_chain\nquiet_mode\ntcp_read_time_out 15000\ntcp_connect_time_out 8000\n[ProxyList]\nsocks5 127.0.0.1 %s\n' "$socks" >"$work/proxychains.conf"
client=("$work/connlat" ttfb 127.0.0.1)
declare -A cmd=(
  [direct]="${client[*]} $srv"
  [haproxy]="${client[*]} $hap"
  [proxychains]="proxychains4 -q -f $work/proxychains.conf ${client[*]} $srv"
)
# The long-lived processes whose CPU counts for each route.
declare -A procs=([haproxy]="$hap_pid" [proxychains]="$socks_pid")

# vlink_routes BINARY SUFFIX PORT... starts the vlink processes of one
# binary on seven ports (tunnel tcp, serve, tunnel zstd, tunnel mux, tunnel
# tcp with goroutines, tunnel tcp via serve to an address and to a name)
# and defines its routes, named with SUFFIX.
vlink_routes() {
  local bin=$1 sfx=$2 ttcp=$3 gw=$4 tzstd=$5 tmux=$6 tgor=$7 tvia=$8 tname=$9 s ttcp_pid gw_pid tzstd_pid tmux_pid tgor_pid tvia_pid tname_pid
  "$bin" tunnel --listen "127.0.0.1:$ttcp" --to "127.0.0.1:$srv" --stack tcp --log-level warn &
  pids+=($!)
  ttcp_pid=$!
  # A build from before --event-loop takes the flag for an error: it has
  # no loop to turn off. (grep reads all: with -q, vlink could die of
  # SIGPIPE and pipefail take the match for a miss.)
  if "$bin" tunnel --help 2>&1 | grep -- --event-loop >/dev/null; then
    "$bin" tunnel --listen "127.0.0.1:$tgor" --to "127.0.0.1:$srv" --stack tcp --event-loop=false --log-level warn &
  else
    "$bin" tunnel --listen "127.0.0.1:$tgor" --to "127.0.0.1:$srv" --stack tcp --log-level warn &
  fi
  pids+=($!)
  tgor_pid=$!
  "$bin" serve --listen "127.0.0.1:$gw" --allow "127.0.0.1:$srv" --allow "localhost:$srv" --log-level warn &
  pids+=($!)
  gw_pid=$!
  "$bin" tunnel --listen "127.0.0.1:$tzstd" --via "127.0.0.1:$gw" --to "127.0.0.1:$srv" --stack zstd --log-level warn &
  pids+=($!)
  tzstd_pid=$!
  "$bin" tunnel --listen "127.0.0.1:$tmux" --via "127.0.0.1:$gw" --to "127.0.0.1:$srv" --stack mux --log-level warn &
  pids+=($!)
  tmux_pid=$!
  "$bin" tunnel --listen "127.0.0.1:$tvia" --via "127.0.0.1:$gw" --to "127.0.0.1:$srv" --stack tcp --log-level warn &
  pids+=($!)
  tvia_pid=$!
  "$bin" tunnel --listen "127.0.0.1:$tname" --via "127.0.0.1:$gw" --to "localhost:$srv" --stack tcp --log-level warn &
  pids+=($!)
  tname_pid=$!
  for s in tcp zstd mux+lz4; do
    printf '[[route]]\nhost = "127.0.0.1"\nports = "%s"\nstack = "%s"\nvia = "127.0.0.1:%s"\n' "$srv" "$s" "$gw" >"$work/exec-$s$sfx.toml"
    cmd[exec-$s$sfx]="$bin exec --config $work/exec-$s$sfx.toml -- ${client[*]} $srv"
    procs[exec-$s$sfx]=$gw_pid
  done
  printf '[[route]]\nhost = "127.0.0.1"\nports = "%s"\nstack = "tcp"\n' "$srv" >"$work/exec-agent$sfx.toml"
  cmd[exec-agent$sfx]="$bin exec --config $work/exec-agent$sfx.toml -- ${client[*]} $srv"
  cmd[exec-agent-ask$sfx]="env VLINK_PRELOAD_CACHE=0 $bin exec --config $work/exec-agent$sfx.toml -- ${client[*]} $srv"
  cmd[tunnel-tcp$sfx]="${client[*]} $ttcp"
  cmd[tunnel-tcp-gor$sfx]="${client[*]} $tgor"
  procs[tunnel-tcp-gor$sfx]=$tgor_pid
  cmd[tunnel-zstd$sfx]="${client[*]} $tzstd"
  cmd[tunnel-mux$sfx]="${client[*]} $tmux"
  procs[tunnel-tcp$sfx]=$ttcp_pid
  procs[tunnel-zstd$sfx]="$tzstd_pid $gw_pid"
  procs[tunnel-mux$sfx]="$tmux_pid $gw_pid"
  cmd[tunnel-via-tcp$sfx]="${client[*]} $tvia"
  cmd[tunnel-via-name$sfx]="${client[*]} $tname"
  procs[tunnel-via-tcp$sfx]="$tvia_pid $gw_pid"
  procs[tunnel-via-name$sfx]="$tname_pid $gw_pid"
  for s in "$ttcp" "$gw" "$tzstd" "$tmux" "$tgor" "$tvia" "$tname"; do wait_listen "$s"; done
  # The shim is built on first use; build it now, outside the timings.
  "$bin" exec -- true 2>/dev/null
}
vroutes="tunnel-tcp tunnel-tcp-gor tunnel-via-tcp tunnel-via-name tunnel-zstd tunnel-mux exec-agent exec-agent-ask exec-tcp exec-zstd exec-mux+lz4"
vlink_routes "$VLINK" "" "$ttcp" "$gw" "$tzstd" "$tmux" "$(p 8)" "$(p 9)" "$(p 10)"
all="direct haproxy $vroutes proxychains"
if [ -n "${BASE:-}" ]; then
  vlink_routes "$BASE" @base "$(p 11)" "$(p 12)" "$(p 13)" "$(p 14)" "$(p 15)" "$(p 16)" "$(p 17)"
  all+=" ${vroutes// /@base }@base"
fi
for port in "$srv" "$hap" "$socks"; do wait_listen "$port"; done
read -ra routes <<<"${ROUTES:-$all}"
n=${#routes[@]}
hz=$(getconf CLK_TCK)

env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $("$VLINK" version); $(haproxy -v | sed -n "1s/ version / /; 1s/ - .*//p")"
echo "$env_line" >&2
: >"$work/results"
for round in $(seq "$ROUNDS"); do
  for i in $(seq 0 $((n - 1))); do
    route=${routes[$(( (i + round) % n ))]}
    before=0 after=0
    # shellcheck disable=SC2086 # word lists on purpose
    [ -n "${procs[$route]:-}" ] && before=$(cpu_ticks ${procs[$route]})
    # The subshell's `times` gives the CPU of the processes it ran: the
    # client, and for exec the agent too.
    # shellcheck disable=SC2086
    out=$( (${cmd[$route]} "$CONNECTS" && times) 2>&1 ) || { echo "round $round $route failed: $out" >&2; exit 1; }
    # shellcheck disable=SC2086
    [ -n "${procs[$route]:-}" ] && after=$(cpu_ticks ${procs[$route]})
    line=$(grep '^n=' <<<"$out")
    children=$(tail -1 <<<"$out" | python3 -c 'import re, sys; print(sum(int(m) * 60 + float(s) for m, s in re.findall(r"(\d+)m([\d.]+)s", sys.stdin.read())))')
    echo "$round $route $line children=$children procs=$(python3 -c "print(($after - $before) / $hz)")" >>"$work/results"
    echo "round $round $route: $line" >&2
  done
done

echo "$env_line"
python3 - "$work/results" "$CONNECTS" "$ROUNDS" <<'PY'
import collections, re, statistics, sys
import targets
path, connects, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = collections.defaultdict(dict)
order = []
for line in open(path):
    rnd, route, rest = line.split(" ", 2)
    f = dict(kv.split("=") for kv in rest.split())
    rows[route][int(rnd)] = {k: float(v) for k, v in f.items()}
    if route not in order:
        order.append(route)
rnds = sorted(rows["direct"])
def excess(route, key="first"):
    return [rows[route][r][key] - rows["direct"][r][key] for r in rnds]
def fmt(xs):
    return f"{statistics.median(xs):7.0f} ({min(xs):.0f}..{max(xs):.0f})"
def ratio(route, base):
    if base not in rows:
        return None
    return [(rows[route][r]["first"] - rows["direct"][r]["first"]) / (rows[base][r]["first"] - rows["direct"][r]["first"]) for r in rnds]
def cpu(route):
    # vlink's CPU per 1,000 connections: the long-lived processes on the
    # path, plus what the client run cost beyond a plain client's (the
    # agent of exec and the shim; for proxychains, its library).
    out = []
    for r in rnds:
        x = rows[route][r]
        out.append((x["procs"] + x["children"] - rows["direct"][r]["children"]) / (connects + 20) * 1000)
    return statistics.median(out)
print(f"connect to the first byte of a one-byte answer, {connects} connects per route and round, {rounds} rounds interleaved")
print(f"direct: median {statistics.median(rows['direct'][r]['first'] for r in rnds):.1f} us (connect alone {statistics.median(rows['direct'][r]['connect'] for r in rnds):.1f})")
print(f"  {'route':<20} {'us over direct: median (min..max)':>34} {'connect alone':>14} {'/ haproxy':>10} {'/ proxychains':>14} {'CPU s / 1k conns':>17}")
med = {}
for route in order:
    if route == "direct":
        continue
    e = excess(route)
    med[route] = statistics.median(e)
    rh, rp = ratio(route, "haproxy"), ratio(route, "proxychains")
    print(f"  {route:<20} {fmt(e):>34} {statistics.median(excess(route, 'connect')):14.0f}"
          f" {statistics.median(rh) if rh else float('nan'):10.2f} {statistics.median(rp) if rp else float('nan'):14.2f} {cpu(route):17.3f}")
twins = [r for r in order if r + "@base" in rows]
if twins:
    print("  before and after in the same rounds: excess over direct, this build / BASE, median of the rounds (min..max)")
    for route in twins:
        x = [(rows[route][r]["first"] - rows["direct"][r]["first"]) / (rows[route + "@base"][r]["first"] - rows["direct"][r]["first"]) for r in rnds]
        print(f"    {route:<20} {statistics.median(x):.2f} ({min(x):.2f}..{max(x):.2f})")
def check(name, route, base, limit):
    if route in rows and base in rows:
        targets.check(name, statistics.median(ratio(route, base)), "<=", limit, "x")
check("tunnel-tcp / haproxy", "tunnel-tcp", "haproxy", 1.0)
check("tunnel-zstd / haproxy", "tunnel-zstd", "haproxy", 2.0)
check("tunnel-mux / tunnel-zstd", "tunnel-mux", "tunnel-zstd", 1.0)
check("exec-tcp / proxychains", "exec-tcp", "proxychains", 1.0)
check("exec-zstd / proxychains", "exec-zstd", "proxychains", 1.0)
check("exec-mux+lz4 / proxychains", "exec-mux+lz4", "proxychains", 0.5)
PY
