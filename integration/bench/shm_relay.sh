#!/usr/bin/env bash
# What shared memory does for a relayed connection: iperf3 (random
# payload) on loopback through
#
#   direct  iperf3 client -> iperf3 server
#   tcp     client -> vlink tunnel --stack STACK -> vlink serve --shm -> server,
#           the tunnel told VLINK_SHM=off: loopback TCP between them
#   shm     the same, the tunnel left to choose (VLINK_SHM unset): shared memory
#
# in the same run, REPS rounds, interleaved and rotated. Prints the median
# Gbit/s (min..max), shm/tcp, and the CPU seconds per GB of the tunnel and
# serve processes.
#
# Environment: STACK (default identity), DURATION (iperf3 -t, default 5),
# REPS (default 3), VLINK, PORT_BASE (default 25700).
STACK=${STACK:-identity}
DURATION=${DURATION:-5}
REPS=${REPS:-3}
PORT_BASE=${PORT_BASE:-25700}
. "$(dirname "$0")/lib.sh"
need iperf3 python3
build_vlink
need_ports 4
iperf3 -s -p "$(p 1)" -B 127.0.0.1 >/dev/null 2>&1 & pids+=($!)
"$VLINK" serve --listen "127.0.0.1:$(p 2)" --shm --target "127.0.0.1:$(p 1)" --log-level warn & pids+=($!); serve=$!
wait_listen "$(p 1)"; wait_listen "$(p 2)"
VLINK_SHM=off "$VLINK" tunnel --listen "127.0.0.1:$(p 3)" --to "127.0.0.1:$(p 2)" --stack "$STACK" --log-level warn & pids+=($!); tun_tcp=$!
VLINK_SHM= "$VLINK" tunnel --listen "127.0.0.1:$(p 4)" --to "127.0.0.1:$(p 2)" --stack "$STACK" --log-level warn & pids+=($!); tun_shm=$!
wait_listen "$(p 3)"; wait_listen "$(p 4)"

declare -A port=([direct]=$(p 1) [tcp]=$(p 3) [shm]=$(p 4)) tun=([direct]= [tcp]=$tun_tcp [shm]=$tun_shm)
paths=(direct tcp shm)
echo "# $(date -u +%FT%TZ) $(uname -sr), $(nproc) CPUs; $("$VLINK" version 2>&1 | head -1); stack $STACK; iperf3 -t $DURATION, $REPS rounds, interleaved and rotated"
results=$work/results
: >"$results"
for r in $(seq "$REPS"); do
  for i in "${!paths[@]}"; do
    path=${paths[$(( (i + r) % ${#paths[@]} ))]}
    before=0
    [ -z "${tun[$path]}" ] || before=$(cpu_ticks "${tun[$path]}" "$serve")
    bps=$(iperf3 -c 127.0.0.1 -p "${port[$path]}" -t "$DURATION" -J | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])')
    after=0
    [ -z "${tun[$path]}" ] || after=$(cpu_ticks "${tun[$path]}" "$serve")
    echo "$path $bps $((after - before))" >>"$results"
  done
done
python3 - "$results" "$DURATION" "$(getconf CLK_TCK)" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
duration, hz = float(sys.argv[2]), float(sys.argv[3])
by = {}
for path, bps, ticks in rows:
    by.setdefault(path, []).append((float(bps), int(ticks)))
med = {}
print(f"{'path':7} {'Gbit/s':>7} {'min..max':>15} {'CPU s/GB':>9}")
for path in ("direct", "tcp", "shm"):
    v = by[path]
    g = [b / 1e9 for b, _ in v]
    gb = [b * duration / 8 / 1e9 for b, _ in v]
    cpu = statistics.median(t / hz / x for (_, t), x in zip(v, gb)) if path != "direct" else float("nan")
    med[path] = statistics.median(g)
    print(f"{path:7} {med[path]:7.2f} {min(g):6.2f}..{max(g):6.2f} {cpu:9.2f}")
print(f"shm / tcp = {med['shm'] / med['tcp']:.2f}")
PY
