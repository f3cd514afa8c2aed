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
# of the serve process. Targets (issue 40, point 7): shared memory carries
# at least 0.95x what loopback TCP does under the relays, at no more CPU
# per GB in either process.
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
    t0=0 s0=0
    [ -z "${tun[$path]}" ] || { t0=$(cpu_ticks "${tun[$path]}"); s0=$(cpu_ticks "$serve"); }
    bps=$(iperf3 -c 127.0.0.1 -p "${port[$path]}" -t "$DURATION" -J | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])')
    t1=0 s1=0
    [ -z "${tun[$path]}" ] || { t1=$(cpu_ticks "${tun[$path]}"); s1=$(cpu_ticks "$serve"); }
    echo "$path $bps $((t1 - t0)) $((s1 - s0))" >>"$results"
  done
done
python3 - "$results" "$DURATION" "$(getconf CLK_TCK)" <<'PY'
import statistics, sys
import targets
rows = [l.split() for l in open(sys.argv[1])]
duration, hz = float(sys.argv[2]), float(sys.argv[3])
by = {}
for path, bps, tun, srv in rows:
    by.setdefault(path, []).append((float(bps), int(tun), int(srv)))
med, cpu = {}, {}
print(f"{'path':7} {'Gbit/s':>7} {'min..max':>15} {'tunnel s/GB':>11} {'serve s/GB':>10}")
for path in ("direct", "tcp", "shm"):
    v = by[path]
    g = [b / 1e9 for b, _, _ in v]
    gb = [b * duration / 8 / 1e9 for b, _, _ in v]
    med[path] = statistics.median(g)
    if path == "direct":
        print(f"{path:7} {med[path]:7.2f} {min(g):6.2f}..{max(g):6.2f} {'-':>11} {'-':>10}")
        continue
    cpu[path] = [statistics.median(r[k] / hz / x for r, x in zip(v, gb)) for k in (1, 2)]
    print(f"{path:7} {med[path]:7.2f} {min(g):6.2f}..{max(g):6.2f} {cpu[path][0]:11.2f} {cpu[path][1]:10.2f}")
print(f"shm / tcp = {med['shm'] / med['tcp']:.2f}")
targets.check("shm / tcp under the relays, Gbit/s", med['shm'] / med['tcp'], ">=", 0.95)
for k, proc in enumerate(("tunnel", "serve")):
    targets.check(f"shm / tcp, CPU s/GB of {proc}", cpu['shm'][k] / cpu['tcp'][k], "<=", 1.0)
PY
