#!/usr/bin/env bash
# The first connection of a new process to a gateway with an identity,
# over a 50 ms lab link: `vlink connect` (one connection per process, as
# ssh's ProxyCommand runs it) sending an HTTP/1.0 request to python3's
# http.server behind `vlink serve --key-file --identity`, its pin file
# already holding the gateway's key. Since Dialer.PinnedKey, the process's
# first flight names the pinned key and the gateway takes it (NKpsk0 at
# once); before, the first connection of every process went the long way
# to learn the key. Routes, interleaved and rotated:
#
#   connect        this build's vlink connect
#   connect@base   BASE's (required), with the same pin file
#
# Each fetch is a new process; the time is from its start to its exit
# (the answer is 1 KiB and the server closes after it), SHA-256 checked.
# It prints per route the median over rounds of each round's median, in
# ms and in round trips of the path (the TCP handshake's time, from curl
# in the same rounds), and the ratio to BASE of the same round.
#
# Needs root (network namespaces), curl and python3. Environment: PROFILE
# (default wan50-clean), N (fetches per route and round, default 20),
# ROUNDS (default 3), VLINK, VLINK_LAB, BASE.
PROFILE=${PROFILE:-wan50-clean}
N=${N:-20}
ROUNDS=${ROUNDS:-3}
. "$(dirname "$0")/lib.sh"
trap 'exit 130' INT
trap 'exit 143' TERM
need_root "network namespaces"
need curl python3
[ -n "${BASE:-}" ] || { echo "connect_first.sh: set BASE to another vlink binary" >&2; exit 2; }
build_vlink
build_vlink_lab
lab_up_web "$PROFILE"
pids+=("$(lab_start server python3 -m http.server 8000 --bind 0.0.0.0 --directory "$work/www")")
pids+=("$(lab_start server "$VLINK" serve --listen "$server:7000" --key-file "$work/key" --identity "$work/identity" --target 127.0.0.1:8000 --log-level warn)")
lab_wait_port server 8000
lab_wait_port server 7000

declare -A bin=([connect]=$VLINK [connect@base]=$BASE)
routes=(connect connect@base)
fetch() { # route round
  local t0 t1
  t0=$EPOCHREALTIME
  printf 'GET /small HTTP/1.0\r\n\r\n' | lab client "${bin[$1]}" connect --stack identity --key-file "$work/key" \
    --known-nodes "$work/known_nodes" --log-level warn "$server:7000" >"$work/got" || { echo "$1: vlink connect failed" >&2; exit 1; }
  t1=$EPOCHREALTIME
  [ "$(sed '1,/^\r$/d' "$work/got" | sha256sum | cut -d' ' -f1)" = "$want" ] || { echo "$1: round $2 fetched something else" >&2; exit 1; }
  echo "$2 $1 $(awk -v a="$t0" -v b="$t1" 'BEGIN { print (b - a) * 1000 }')" >>"$work/fetches"
}
rtt() { # one TCP handshake's time through the delay line, ms
  lab client curl -q -s --noproxy '*' -o /dev/null -w '%{time_connect}' "http://$server:8000/small" | awk '{ print $1 * 1000 }'
}

env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $("$VLINK" version); $PROFILE"
echo "$env_line" >&2
: >"$work/fetches"
: >"$work/rtt"
fetch connect 0 # pins the gateway's key, untimed
for round in $(seq "$ROUNDS"); do
  for i in 0 1; do
    route=${routes[$(( (i + round) % 2 ))]}
    for _ in $(seq "$N"); do fetch "$route" "$round"; done
  done
  for _ in $(seq 5); do echo "$round $(rtt)" >>"$work/rtt"; done
done

echo "$env_line"
python3 - "$work/fetches" "$work/rtt" "$N" "$ROUNDS" <<'PY'
import collections, statistics, sys
fetches, rtt_path, n, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
t = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(fetches):
    rnd, route, ms = line.split()
    if rnd != "0":
        t[route][int(rnd)].append(float(ms))
rtts = collections.defaultdict(list)
for line in open(rtt_path):
    rnd, ms = line.split()
    rtts[int(rnd)].append(float(ms))
rnds = sorted(rtts)
rtt = {r: statistics.median(rtts[r]) for r in rnds}
med = {route: {r: statistics.median(t[route][r]) for r in rnds} for route in t}
m = statistics.median
print(f"a new vlink connect process per fetch (1 KiB HTTP/1.0 answer), start to exit, {n} per route and round, {rounds} rounds interleaved")
print(f"RTT of the path (curl's TCP handshake): median {m(rtt.values()):.1f} ms")
print(f"  {'route':<14} {'ms: median (min..max)':>24} {'RTTs':>6} {'/ base':>7}")
for route in ("connect", "connect@base"):
    xs = list(med[route].values())
    ratio = m([med[route][r] / med["connect@base"][r] for r in rnds])
    print(f"  {route:<14} {f'{m(xs):.1f} ({min(xs):.1f}..{max(xs):.1f})':>24} {m([med[route][r] / rtt[r] for r in rnds]):6.2f} {ratio:7.2f}")
saved = m([(med["connect@base"][r] - med["connect"][r]) / rtt[r] for r in rnds])
print(f"  round trips saved per process: {saved:.2f}")
PY
