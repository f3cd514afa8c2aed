#!/usr/bin/env bash
# Parallel streams on the WAN lab: iperf3 through vlink's parallel layer
# against a single TCP flow and against iperf3's own parallel streams, on
# each lab profile, measured in the same run with the paths interleaved.
#
#   tcp          iperf3 -P 1, straight over the lab link (one TCP flow)
#   iperf3-P<k>  iperf3 -P k, straight over the link (k TCP flows)
#   parallel-<n> iperf3 (one data connection) -> vlink tunnel
#                --stack parallel:streams=n -> vlink serve -> iperf3 server
#   auto-16      the same with parallel:streams=16,auto
#
# For each path it prints the median Mbit/s received over REPS runs
# (min..max), the ratio to a single TCP flow, and the CPU seconds per GB
# received: both iperf3 processes (from iperf3's own report) plus, for the
# vlink paths, the tunnel and serve processes (from /proc). The lab's
# delay line runs in the vlink-lab process and is not counted (it is the
# same for every path).
#
# Needs root (network namespaces). Environment: PROFILES (default
# "wan50 wan50-clean"), COUNTS (substreams and iperf3 -P values, default
# "2 4 8 16"), DURATION (iperf3 -t, default 20), REPS (default 3), VLINK
# and VLINK_LAB (binaries; default: built from this checkout).
PROFILES=${PROFILES:-"wan50 wan50-clean"}
COUNTS=${COUNTS:-"2 4 8 16"}
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
  serve=$(lab_start server "$VLINK" serve --listen "$server:7000" --target 127.0.0.1:5201 --log-level warn)
  lab_wait_port server 7000
  declare -A port=()
  tunnels=()
  for n in $COUNTS; do
    port[parallel-$n]=$((8100 + n))
    tunnels+=("$(lab_start client "$VLINK" tunnel --listen "127.0.0.1:$((8100 + n))" --to "$server:7000" --stack "parallel:streams=$n" --log-level warn)")
    lab_wait_port client $((8100 + n))
  done
  port[auto-16]=8199
  tunnels+=("$(lab_start client "$VLINK" tunnel --listen 127.0.0.1:8199 --to "$server:7000" --stack "parallel:streams=16,auto" --log-level warn)")
  lab_wait_port client 8199

  paths=(tcp)
  for k in $COUNTS; do paths+=("iperf3-P$k"); done
  for n in $COUNTS; do paths+=("parallel-$n"); done
  paths+=(auto-16)

  echo "== $profile: ${#paths[@]} paths, $REPS rounds of ${DURATION}s" >&2
  for rep in $(seq "$REPS"); do
    echo " round $rep" >&2
    for path in $(printf '%s\n' "${paths[@]}" | shuf); do
      case $path in
        tcp) lab_iperf "$results" "$profile" "$path" -- -t "$DURATION" -c "$server" -P 1 ;;
        iperf3-P*) lab_iperf "$results" "$profile" "$path" -- -t "$DURATION" -c "$server" -P "${path#iperf3-P}" ;;
        *) lab_iperf "$results" "$profile" "$path" "$serve" "${tunnels[@]}" -- -t "$DURATION" -c 127.0.0.1 -p "${port[$path]}" ;;
      esac
    done
  done
  kill "$serve" "${tunnels[@]}" 2>/dev/null || true
  lab_down
  unset port
done

python3 - "$results" <<'PY'
import sys
import targets, wan_report
rows = wan_report.read(sys.argv[1])
wan_report.report(rows)
for profile, paths in rows.items():
    base = wan_report.median(paths.get("tcp", [(float("nan"), 1, 0, 0)]))
    for k in ("8",):
        if f"parallel-{k}" in paths and f"iperf3-P{k}" in paths:
            p = wan_report.median(paths[f"parallel-{k}"])
            i = wan_report.median(paths[f"iperf3-P{k}"])
            targets.check(f"parallel-{k} / a single TCP flow", p / base, ">=", 4)
            targets.check(f"parallel-{k} / iperf3 -P {k}", p / i, ">=", 0.9)
PY
