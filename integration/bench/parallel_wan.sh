#!/usr/bin/env bash
# Parallel streams on the WAN lab: iperf3 through vlink's parallel layer
# against a single TCP flow (CUBIC and BBR) and against iperf3's own
# parallel streams, on each lab profile, measured in the same run with the
# paths interleaved.
#
#   tcp          iperf3 -P 1, straight over the lab link (one CUBIC flow)
#   bbr          the same with iperf3 -C bbr
#   iperf3-P<k>  iperf3 -P k, straight over the link (k TCP flows)
#   parallel-<n> iperf3 (one data connection) -> vlink tunnel
#                --stack parallel:streams=n -> vlink serve -> iperf3 server
#   auto-16      the same with parallel:streams=16,auto
#   auto-16@base the same through BASE's tunnel and serve (with BASE set)
#   *-down       the same path downloading (iperf3 -R): the server sends
#
# For each path it prints the median Mbit/s received over REPS runs
# (min..max), the ratio to a single TCP flow, and the CPU seconds per GB
# received: both iperf3 processes (from iperf3's own report) plus, for the
# vlink paths, the tunnel and serve processes (from /proc). The lab's
# delay line runs in the vlink-lab process and is not counted (it is the
# same for every path). Then, round by round, auto-16 against the best
# fixed setting of the same round (issue 40: within 0.9x in every round).
#
# Needs root (network namespaces). Environment: PROFILES (default "wan50
# wan50-capped"), COUNTS (substreams, default "2 4 8 16"), IPERF_COUNTS
# (iperf3 -P values, default "8"), DOWN (download paths, default
# "parallel-16 auto-16"; empty for none), DURATION (iperf3 -t, default
# 20), REPS (default 5), VLINK and VLINK_LAB (binaries; default: built
# from this checkout), BASE (another vlink binary, for auto-16@base).
PROFILES=${PROFILES:-"wan50 wan50-capped"}
COUNTS=${COUNTS:-"2 4 8 16"}
IPERF_COUNTS=${IPERF_COUNTS-"8"}
DOWN=${DOWN-"parallel-16 auto-16"}
DURATION=${DURATION:-20}
REPS=${REPS:-5}
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
  declare -A port=() procs=()
  tunnel() { # path port serve-pid binary serve-port stack
    port[$1]=$2
    procs[$1]="$3 $(lab_start client "$4" tunnel --listen "127.0.0.1:$2" --to "$server:${5}" --stack "$6" --log-level warn)"
    lab_wait_port client "$2"
  }
  for n in $COUNTS; do tunnel "parallel-$n" $((8100 + n)) "$serve" "$VLINK" 7000 "parallel:streams=$n"; done
  tunnel auto-16 8199 "$serve" "$VLINK" 7000 "parallel:streams=16,auto"
  paths=(tcp bbr)
  for k in $IPERF_COUNTS; do paths+=("iperf3-P$k"); done
  for n in $COUNTS; do paths+=("parallel-$n"); done
  paths+=(auto-16)
  if [ -n "${BASE:-}" ]; then
    bserve=$(lab_start server "$BASE" serve --listen "$server:7001" --target 127.0.0.1:5201 --log-level warn)
    lab_wait_port server 7001
    tunnel auto-16@base 8198 "$bserve" "$BASE" 7001 "parallel:streams=16,auto"
    paths+=(auto-16@base)
  fi
  for p in $DOWN; do paths+=("$p-down"); done

  echo "== $profile: ${#paths[@]} paths, $REPS rounds of ${DURATION}s" >&2
  for rep in $(seq "$REPS"); do
    echo " round $rep" >&2
    for path in $(printf '%s\n' "${paths[@]}" | shuf); do
      case $path in
        tcp) lab_iperf "$results" "$profile" "$path" -- -t "$DURATION" -c "$server" -P 1 ;;
        bbr) lab_iperf "$results" "$profile" "$path" -- -t "$DURATION" -c "$server" -P 1 -C bbr ;;
        iperf3-P*) lab_iperf "$results" "$profile" "$path" -- -t "$DURATION" -c "$server" -P "${path#iperf3-P}" ;;
        *-down) p=${path%-down}; lab_iperf "$results" "$profile" "$path" ${procs[$p]} -- -t "$DURATION" -c 127.0.0.1 -p "${port[$p]}" -R ;;
        *) lab_iperf "$results" "$profile" "$path" ${procs[$path]} -- -t "$DURATION" -c 127.0.0.1 -p "${port[$path]}" ;;
      esac
    done
  done
  for p in "${!procs[@]}"; do kill ${procs[$p]} 2>/dev/null || true; done
  lab_down
  unset port procs
done

python3 - "$results" "$COUNTS" <<'PY'
import sys
import targets, wan_report
rows = wan_report.read(sys.argv[1])
counts = sys.argv[2].split()
wan_report.report(rows)
for profile, paths in rows.items():
    base = wan_report.median(paths.get("tcp", [(float("nan"), 1, 0, 0)]))
    if "parallel-8" in paths and "iperf3-P8" in paths:
        p = wan_report.median(paths["parallel-8"])
        i = wan_report.median(paths["iperf3-P8"])
        targets.check(f"{profile}: parallel-8 / a single TCP flow", p / base, ">=", 4)
        targets.check(f"{profile}: parallel-8 / iperf3 -P 8", p / i, ">=", 0.9)
    # auto against the best fixed setting, round by round (the rows of a
    # path are in the order of the rounds)
    for auto in ("auto-16", "auto-16@base"):
        fixed = [paths[f"parallel-{n}"] for n in counts if f"parallel-{n}" in paths]
        if auto not in paths or not fixed:
            continue
        ratios = []
        for r, run in enumerate(paths[auto]):
            best = max(f[r][0] for f in fixed if r < len(f))
            ratios.append(run[0] / best)
        print(f"  {profile}: {auto} / the best fixed setting of each round: " + " ".join(f"{x:.2f}" for x in ratios))
        if auto == "auto-16":
            targets.check(f"{profile}: rounds with auto-16 >= 0.9x the best fixed setting", sum(x >= 0.9 for x in ratios) / len(ratios), ">=", 1)
PY
