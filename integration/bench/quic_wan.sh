#!/usr/bin/env bash
# QUIC on the WAN lab: iperf3 through vlink tunnel -> vlink serve over
# QUIC, against one TCP flow and against vlink's parallel streams, on each
# lab profile, measured in the same run with the paths interleaved.
#
#   tcp          iperf3 -P 1, straight over the lab link (one TCP flow)
#   tunnel-tcp   iperf3 -> vlink tunnel --stack tcp -> vlink serve -> iperf3
#                (one TCP flow through both relays: what vlink itself costs)
#   parallel-8   the same with --stack parallel:streams=8 (8 TCP flows)
#   quic         the same with --stack quic (one QUIC connection, one stream)
#
# For each path it prints the median Mbit/s received over REPS runs
# (min..max), the ratio to a single TCP flow, and the CPU seconds per GB
# received: both iperf3 processes (from iperf3's own report) plus, for the
# vlink paths, the tunnel and serve processes (from /proc). The lab's
# delay line runs in the vlink-lab process and is not counted.
#
# Targets (issue 40, point 7: throughput and CPU, each against the
# same run): on each profile, quic carries at least 0.9x what the tunnel
# carries over one TCP flow (tunnel-tcp: the same relays, TCP below),
# and the vlink processes spend at most 3x tunnel-tcp's CPU seconds per
# GB (a byte over QUIC costs about 3x one over TCP on loopback,
# BENCHMARKS §4: user-space packets, acknowledgements and TLS).
#
# Needs root (network namespaces). Environment: PROFILES (default
# "wan50 wan50-clean"), DURATION (iperf3 -t, default 20), REPS (default
# 3), VLINK and VLINK_LAB (binaries; default: built from this checkout).
PROFILES=${PROFILES:-"wan50 wan50-clean"}
DURATION=${DURATION:-20}
REPS=${REPS:-3}
. "$(dirname "$0")/lib.sh"
need_root "network namespaces"
need iperf3 python3
build_vlink
build_vlink_lab

results=$work/results.txt
: >"$results"

for profile in $PROFILES; do
  lab_up "$profile"
  serve=$(lab_start server "$VLINK" serve --listen "$server:7000" --quic --target 127.0.0.1:5201 --log-level warn)
  lab_wait_port server 7000
  declare -A port=([tunnel-tcp]=8101 [parallel-8]=8108 [quic]=8110)
  declare -A stack=([tunnel-tcp]=tcp [parallel-8]=parallel:streams=8 [quic]=quic)
  tunnels=()
  for path in tunnel-tcp parallel-8 quic; do
    tunnels+=("$(lab_start client "$VLINK" tunnel --listen "127.0.0.1:${port[$path]}" --to "$server:7000" --stack "${stack[$path]}" --log-level warn)")
    lab_wait_port client "${port[$path]}"
  done
  paths=(tcp tunnel-tcp parallel-8 quic)

  echo "== $profile: ${#paths[@]} paths, $REPS rounds of ${DURATION}s" >&2
  for rep in $(seq "$REPS"); do
    echo " round $rep" >&2
    for path in $(printf '%s\n' "${paths[@]}" | shuf); do
      case $path in
        tcp) lab_iperf "$results" "$profile" "$path" -- -t "$DURATION" -c "$server" -P 1 ;;
        *) lab_iperf "$results" "$profile" "$path" "$serve" "${tunnels[@]}" -- -t "$DURATION" -c 127.0.0.1 -p "${port[$path]}" ;;
      esac
    done
  done
  kill "$serve" "${tunnels[@]}" 2>/dev/null || true
  lab_down
  unset port stack
done

python3 - "$results" <<'PY'
import sys
import targets, wan_report
rows = wan_report.read(sys.argv[1])
wan_report.report(rows)


def vlink_cpu_per_gb(runs):
    gb = sum(r[1] for r in runs) / 1e9
    return sum(r[3] + r[4] for r in runs) / gb if gb else float("nan")


for profile, paths in rows.items():
    if "quic" in paths and "tunnel-tcp" in paths:
        q, t = paths["quic"], paths["tunnel-tcp"]
        targets.check(f"{profile}: quic / tunnel-tcp, Mbit/s", wan_report.median(q) / wan_report.median(t), ">=", 0.9)
        targets.check(f"{profile}: quic / tunnel-tcp, CPU s/GB of the vlink processes", vlink_cpu_per_gb(q) / vlink_cpu_per_gb(t), "<=", 3.0)
PY
