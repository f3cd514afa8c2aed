#!/usr/bin/env bash
# What a BBR transfer through vlink does to a CUBIC flow sharing the
# lab's bottleneck: two iperf3 transfers at once, for DURATION seconds,
# on each profile, REPS rounds:
#
#   cubic+cubic   two iperf3 -C cubic flows straight over the link (the
#                 share two loss-based flows reach)
#   cubic+bbr     one iperf3 -C cubic flow, and one through vlink tunnel
#                 --stack identity+tcp:cc=bbr -> vlink serve
#
# Prints, per pair, the median Mbit/s of each flow and its share of the
# two, and for the pair through vlink the CPU seconds per GB of vlink
# tunnel and vlink serve (median). No target: the figure says what a user who turns BBR on does to
# the CUBIC flows beside it.
#
# Needs root (network namespaces) and a kernel offering bbr. Environment:
# PROFILES (default "wan50 wan50-clean"), DURATION (default 20), REPS
# (default 3), VLINK and VLINK_LAB (binaries; default: built from this
# checkout).
PROFILES=${PROFILES:-"wan50 wan50-clean"}
DURATION=${DURATION:-20}
REPS=${REPS:-3}
. "$(dirname "$0")/lib.sh"
need_root "network namespaces"
need iperf3 python3
grep -qw bbr /proc/sys/net/ipv4/tcp_available_congestion_control || modprobe tcp_bbr 2>/dev/null || true
grep -qw bbr /proc/sys/net/ipv4/tcp_available_congestion_control || { echo "the kernel offers no bbr" >&2; exit 1; }
build_vlink
build_vlink_lab

results=$work/results.txt
: >"$results"

# pair PROFILE NAME ARGS1 -- ARGS2: two iperf3 clients at once; the CPU of
# the vlink processes in vlinks (tunnel, serve) over the second's bytes.
vlinks=()
pair() {
  local profile=$1 name=$2 a=() b=() t0=0 t1=0 s0=0 s1=0
  shift 2
  while [ "$1" != -- ]; do a+=("$1"); shift; done
  shift
  b=("$@")
  [ "$name" = cubic+cubic ] || { t0=$(cpu_ticks "${vlinks[0]}"); s0=$(cpu_ticks "${vlinks[1]}"); }
  lab client iperf3 -J -t "$DURATION" "${a[@]}" >"$work/a.json" &
  local pa=$!
  lab client iperf3 -J -t "$DURATION" "${b[@]}" >"$work/b.json" || true
  wait "$pa" || true
  [ "$name" = cubic+cubic ] || { t1=$(cpu_ticks "${vlinks[0]}"); s1=$(cpu_ticks "${vlinks[1]}"); }
  python3 - "$profile" "$name" "$work/a.json" "$work/b.json" $((t1 - t0)) $((s1 - s0)) "$(getconf CLK_TCK)" >>"$results" <<'PY' || echo "$profile $name: iperf3 failed" >&2
import json, sys
recv = [json.load(open(f))["end"]["sum_received"] for f in sys.argv[3:5]]
gb, hz = recv[1]["bytes"] / 1e9, int(sys.argv[7])
print(sys.argv[1], sys.argv[2], *(r["bits_per_second"] / 1e6 for r in recv), int(sys.argv[5]) / hz / gb, int(sys.argv[6]) / hz / gb)
PY
  printf '  %-12s %s\n' "$name" "$(tail -1 "$results" | awk '{printf "%.1f + %.1f Mbit/s", $3, $4}')" >&2
}

for profile in $PROFILES; do
  lab_up "$profile"
  lab server iperf3 -s -D -p 5202 -I "$work/iperf3-2.pid"
  serve=$(lab_start server "$VLINK" serve --listen "$server:7000" --target 127.0.0.1:5202 --log-level warn)
  lab_wait_port server 7000
  bbr=$(lab_start client "$VLINK" tunnel --listen 127.0.0.1:8102 --to "$server:7000" --stack identity+tcp:cc=bbr --log-level warn)
  lab_wait_port client 8102
  vlinks=("$bbr" "$serve")
  echo "== $profile" >&2
  for rep in $(seq "$REPS"); do
    echo " round $rep" >&2
    for p in $(printf '%s\n' cubic+cubic cubic+bbr | shuf); do
      case $p in
        cubic+cubic) pair "$profile" "$p" -c "$server" -p 5201 -C cubic -- -c "$server" -p 5202 -C cubic ;;
        cubic+bbr) pair "$profile" "$p" -c "$server" -p 5201 -C cubic -- -c 127.0.0.1 -p 8102 ;;
      esac
    done
  done
  lab server kill "$(cat "$work/iperf3-2.pid")" || true
  kill "$serve" "$bbr" 2>/dev/null || true
  lab_down
done

echo "# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs; $("$VLINK" version | head -1); two iperf3 at once for ${DURATION}s, $REPS rounds"
python3 - "$results" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    profile, pair, a, b, tun, srv = line.split()
    rows[(profile, pair)].append((float(a), float(b), float(tun), float(srv)))
print(f"{'profile':<12} {'pair':<12} {'first Mbit/s':>12} {'second':>8} {'first share':>11} {'CPU s/GB tunnel':>15} {'serve':>6}")
for (profile, pair), runs in rows.items():
    a = statistics.median(r[0] for r in runs)
    b = statistics.median(r[1] for r in runs)
    share = statistics.median(r[0] / (r[0] + r[1]) for r in runs)
    cpu = ["-", "-"] if pair == "cubic+cubic" else [f"{statistics.median(r[i] for r in runs):.2f}" for i in (2, 3)]
    print(f"{profile:<12} {pair:<12} {a:12.1f} {b:8.1f} {share:11.2f} {cpu[0]:>15} {cpu[1]:>6}")
PY
