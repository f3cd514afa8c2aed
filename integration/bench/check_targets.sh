#!/usr/bin/env bash
# Checks every benchmark target of docs/BENCHMARKS.md on demand: the Go
# benchmarks that carry one (each fails on a miss) and every bench script
# (each exits 3 on a miss), one after the other, then a summary. Exits 0
# if all were met, 3 if any was missed, 1 if any could not run. Takes
# about an hour with the scripts' defaults; their knobs (DURATION, REPS,
# ...) pass through. Never part of CI: on a shared machine a single run
# can miss by noise, and a miss here is a figure to look at, with its
# baseline beside it, before it is a bug.
#
# Environment: ONLY (space-separated names to run, e.g. "dial tunnel_vs_socat").
set -uo pipefail
cd "$(dirname "$0")/../.."

declare -A result
run() { # name command...
  local name=$1
  shift
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  echo "=== $name: $*"
  "$@"
  case $? in
    0) result[$name]=met ;;
    3) result[$name]=MISSED ;;
    *) result[$name]="did not run" ;;
  esac
}
gobench() { # the benchmark's -bench, package: a miss fails it
  local out rc
  out=$(go test -run '^$' -bench "$1" -benchtime "${2:-2s}" "$3" 2>&1)
  rc=$?
  echo "$out" | grep -E '^Benchmark|target '
  if [ "$rc" -ne 0 ]; then
    grep -q 'MISSED' <<<"$out" && return 3
    echo "$out" | tail -20
    return 1
  fi
}

run dial gobench DialPaired 2s ./vlink/
run reach_setup gobench ReachSetup 40x ./integration/ # root: a lab at 20 ms RTT
run compress_random gobench 'Stack/random' 2s ./filters/compress/
run adaptive_link gobench 'Link' 5x ./filters/compress/ # 100M needs root and tc
run idle_conns bash integration/bench/idle_conns.sh
for s in tunnel_vs_socat datapath preload connect_cost ssh_socks compress_vs_ssh noise_vs_ssh relay_vs_serve relay_idle parallel_wan connect_under_attack udp exec_udp cc_wan first_byte; do # mux_ttfb has no target
  run "$s" bash "integration/bench/$s.sh"
done

echo "=== summary"
status=0
for name in "${!result[@]}"; do
  printf '  %-16s %s\n' "$name" "${result[$name]}"
  case ${result[$name]} in
    MISSED) [ "$status" -eq 0 ] && status=3 ;;
    met) ;;
    *) status=1 ;;
  esac
done
exit "$status"
