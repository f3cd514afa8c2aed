#!/usr/bin/env bash
# An all-to-all among the N workers of one vlink launch job on this
# machine (launch.Join; each rank sends BYTES to every other at once,
# between two barriers): ranks of one host over shared memory (the
# default) against the same job with --shm=false, where they talk
# through the job's network (TCP spliced between the ranks, noise
# encrypted). REPS rounds (default 5), the two interleaved, for N = 2, 4
# and 8 (NS). Prints the median aggregate rate (N(N-1)BYTES over the
# slowest rank's time) and the spread, and the CPU seconds per GB moved
# of all the workers together over the exchange.
#
#   bash integration/bench/launch_a2a.sh
. "$(dirname "$0")/lib.sh"
build_vlink
worker=$work/launchworker
(cd "$root" && go build -o "$worker" ./integration/testdata/launchworker)
REPS=${REPS:-5} BYTES=${BYTES:-100000000} NS=${NS:-2 4 8}

echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg); $REPS rounds, interleaved; $BYTES bytes from every rank to every other"
printf '%-3s %-8s %24s %14s\n' N path "Gbit/s aggregate" "CPU s/GB"
for n in $NS; do
  : >"$work/shm" && : >"$work/network"
  for _ in $(seq "$REPS"); do
    for path in shm network; do
      shm=true && [ "$path" = network ] && shm=false
      "$VLINK" launch -n "$n" --shm="$shm" -- "$worker" a2a "$BYTES" >"$work/out"
      # [R] rank R: a2a BYTES bytes to each of P peers in T s, cpu C s
      awk -v n="$n" -v b="$BYTES" '/ a2a / { t = $(NF-4) + 0; if (t > max) max = t; cpu += $(NF-1) }
        END { if (NR != n) exit 1; moved = n * (n - 1) * b; printf "%f %f\n", moved * 8 / max / 1e9, cpu / (moved / 1e9) }' "$work/out" >>"$work/$path"
    done
  done
  python3 - "$n" "$work/shm" "$work/network" <<'PY'
import statistics, sys
n = sys.argv[1]
rows = {}
for path, f in (("shm", sys.argv[2]), ("network", sys.argv[3])):
    rows[path] = [tuple(map(float, l.split())) for l in open(f)]
med = lambda v: statistics.median(v)
for path, r in rows.items():
    rate, cpu = [x[0] for x in r], [x[1] for x in r]
    print(f"{n:<3} {path:<8} {med(rate):7.2f} ({min(rate):.2f}..{max(rate):.2f}) {med(cpu):6.2f} ({min(cpu):.2f}..{max(cpu):.2f})")
s, t = rows["shm"], rows["network"]
ratio = [a[0] / b[0] for a, b in zip(s, t)]
cpur = [a[1] / b[1] for a, b in zip(s, t)]
print(f"{n:<3} shm/network  rate {med(ratio):.2f}x ({min(ratio):.2f}..{max(ratio):.2f}), CPU per GB {med(cpur):.2f}x ({min(cpur):.2f}..{max(cpur):.2f})")
PY
done
