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

hz=$(getconf CLK_TCK)
results=$work/results.txt
: >"$results"

for profile in $PROFILES; do
  out=$("$VLINK_LAB" up --detach "$profile")
  lab_id=$(sed -n 's/.*vlink-lab down \([0-9-]*\).*/\1/p' <<<"$out" | head -1)
  server=10.77.0.2
  lab server iperf3 -s -D -p 5201
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
    for path in $(printf '%s\n' "${paths[@]}" | shuf); do
      case $path in
        tcp) args=(-c "$server" -P 1); procs=() ;;
        *) args=(-c 127.0.0.1 -p "${port[$path]}"); procs=("$serve" "${tunnels[@]}") ;;
      esac
      before=0
      [ ${#procs[@]} -gt 0 ] && before=$(cpu_ticks "${procs[@]}")
      lab client iperf3 -J -t "$DURATION" "${args[@]}" >"$work/run.json" || true
      after=0
      [ ${#procs[@]} -gt 0 ] && after=$(cpu_ticks "${procs[@]}")
      python3 - "$profile" "$path" $((after - before)) "$hz" "$work/run.json" >>"$results" <<'PY' || echo "$profile $path: iperf3 failed" >&2
import json, sys
profile, path, ticks, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
r = json.load(open(sys.argv[5]))
end = r["end"]
recv = end["sum_received"]
cpu = end["cpu_utilization_percent"]
iperf_cpu = (cpu["host_total"] + cpu["remote_total"]) / 100 * recv["seconds"]
print(profile, path, recv["bits_per_second"] / 1e6, recv["bytes"], iperf_cpu, ticks / hz)
PY
      printf '  round %s %-12s %s\n' "$rep" "$path" "$(tail -1 "$results" | awk '{printf "%.1f Mbit/s", $3}')" >&2
    done
  done
  lab server pkill iperf3 || true
  kill "$serve" "${tunnels[@]}" 2>/dev/null || true
  "$VLINK_LAB" down "$lab_id" >/dev/null
  lab_id=
  unset port stack
done

python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    profile, path, mbps, nbytes, icpu, vcpu = line.split()
    rows.setdefault(profile, {}).setdefault(path, []).append((float(mbps), int(nbytes), float(icpu), float(vcpu)))
for profile, paths in rows.items():
    base = statistics.median(m for m, *_ in paths.get("tcp", [(float("nan"), 1, 0, 0)]))
    print(f"{profile}")
    print(f"  {'path':<12} {'Mbit/s':>8} {'min..max':>16} {'x tcp':>7} {'CPU s/GB':>9} {'(vlink)':>8}")
    for path, runs in paths.items():
        m = [r[0] for r in runs]
        gb = sum(r[1] for r in runs) / 1e9
        cpu = sum(r[2] + r[3] for r in runs) / gb if gb else float("nan")
        vcpu = sum(r[3] for r in runs) / gb if gb else float("nan")
        med = statistics.median(m)
        print(f"  {path:<12} {med:8.1f} {min(m):7.1f}..{max(m):7.1f} {med / base:7.2f} {cpu:9.2f} {vcpu:8.2f}")
PY
