#!/usr/bin/env bash
# How long vlink launch takes to start a job whose N workers all join its
# network (launch.Join, then exit), against starting the same N processes
# with a plain shell loop (the same program, told only to start and
# exit), for N = 2, 8 and 32 with the local spawner. REPS rounds (default
# 5), the two interleaved; prints the median wall time and the spread of
# each, and their ratio.
#
#   bash integration/bench/launch.sh
. "$(dirname "$0")/lib.sh"
build_vlink
worker=$work/launchworker
(cd "$root" && go build -o "$worker" ./integration/testdata/launchworker)
REPS=${REPS:-5}

now() { date +%s%N; }
echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) CPUs; $REPS rounds, interleaved"
printf '%-4s %22s %22s %8s\n' N "vlink launch ms" "shell loop ms" ratio
for n in 2 8 32; do
  launch=() loop=()
  for _ in $(seq "$REPS"); do
    t0=$(now)
    "$VLINK" launch -n "$n" -- "$worker" join >/dev/null
    t1=$(now)
    for _ in $(seq "$n"); do "$worker" start & done
    wait
    t2=$(now)
    launch+=($(( (t1 - t0) / 1000 ))) loop+=($(( (t2 - t1) / 1000 )))
  done
  python3 - "$n" "${launch[*]}" "${loop[*]}" <<'PY'
import statistics, sys
n, a, b = sys.argv[1], [int(x) / 1000 for x in sys.argv[2].split()], [int(x) / 1000 for x in sys.argv[3].split()]
ma, mb = statistics.median(a), statistics.median(b)
f = lambda m, v: f"{m:7.1f} ({min(v):.1f}..{max(v):.1f})"
print(f"{n:<4} {f(ma, a):>22} {f(mb, b):>22} {ma / mb:7.1f}x")
PY
done
