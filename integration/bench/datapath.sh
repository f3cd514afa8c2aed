#!/usr/bin/env bash
# The data path on incompressible bytes: iperf3 (its payload is random) on
# loopback through
#
#   direct     iperf3 client -> iperf3 server
#   tcp        client -> vlink tunnel --stack tcp -> server (no hello: the plain relay)
#   STACK      client -> vlink tunnel --stack STACK -> vlink serve --target -> server
#
# for each STACK of STACKS (default: identity adaptive lz4 zstd s2), in the
# same run, REPS rounds, the paths interleaved and rotated each round.
# Prints the median Gbit/s (min..max), the ratios against identity and
# direct, and the CPU seconds per GB of each vlink process (tunnel, serve),
# and checks the targets of issue 18: adaptive >= 0.95x identity, each
# fixed codec >= 0.9x identity, the plain relay >= 0.9x direct; and what
# they cost, issue 40's: in each vlink process, adaptive's CPU per GB
# within 1.15x identity's, each fixed codec's within 1.5x.
#
# With BASE=/path/to/another/vlink (a build of another commit), each STACK
# is also run through that binary's tunnel and serve, as path STACK@base,
# interleaved with the others, and the report gives each stack's ratio
# against its base: a before/after comparison in one run.
#
# With PERF=DIR it also records `perf record -g` of the tunnel and the
# serve process during each path's first round into DIR/PATH-{tunnel,serve}.data
# (read them with perf report -i).
#
# Needs iperf3 and python3 (integration/deps.sh installs them).
#
# With PIN=1 the vlink processes run on CPU 1 and the iperf3 ends on CPU
# 0 (taskset): the relays then share one core, so the path's rate is set
# by what they cost, as where a tunnel's host is busy with other work,
# rather than by the kernel's TCP work that the ends do for them on
# loopback.
#
# Environment: DURATION (iperf3 -t, default 5), REPS (default 3), STACKS,
# VLINK (a vlink binary; default: built from this checkout), PORT_BASE
# (default 25500; uses PORT_BASE+1 and up, two ports per stack), PIN.
DURATION=${DURATION:-5}
REPS=${REPS:-3}
PORT_BASE=${PORT_BASE:-25500}
STACKS=${STACKS:-identity adaptive lz4 zstd s2}
PERF=${PERF:-}
BASE=${BASE:-}
PIN=${PIN:-}
. "$(dirname "$0")/lib.sh"
need iperf3 python3
[ -z "$PERF" ] || need perf
build_vlink
relay_cpu=() ends_cpu=()
if [ -n "$PIN" ]; then
  need taskset
  [ "$(nproc)" -ge 2 ] || { echo "datapath.sh: PIN needs 2 CPUs" >&2; exit 1; }
  relay_cpu=(taskset -c 1) ends_cpu=(taskset -c 0)
fi

read -ra stacks <<<"$STACKS"
runs=("${stacks[@]}")
[ -z "$BASE" ] || for s in "${stacks[@]}"; do runs+=("$s@base"); done
need_ports $((2 + 2 * ${#runs[@]}))
iperf_port=$(p 1)
"${ends_cpu[@]}" iperf3 -s -B 127.0.0.1 -p "$iperf_port" >"$work/iperf3.log" 2>&1 &
pids+=($!)

# name -> the port iperf3 connects to, and the vlink processes on the path.
declare -A port tunnel serve serve_port
start_tunnel() { # binary name port stack to
  "${relay_cpu[@]}" "$1" tunnel --listen "127.0.0.1:$3" --to "$5" --stack "$4" --log-level warn 2>>"$work/tunnel.log" &
  pids+=($!)
  port[$2]=$3 tunnel[$2]=$!
}
port[direct]=$iperf_port
start_tunnel "$VLINK" tcp "$(p 2)" tcp "127.0.0.1:$iperf_port"
k=3
for name in "${runs[@]}"; do
  bin=$VLINK
  [ "${name%@base}" = "$name" ] || bin=$BASE
  # One serve per stack, so its CPU time is that stack's alone.
  "${relay_cpu[@]}" "$bin" serve --listen "127.0.0.1:$(p $k)" --target "127.0.0.1:$iperf_port" --log-level warn 2>>"$work/serve.log" &
  pids+=($!)
  serve[$name]=$! serve_port[$name]=$(p $k)
  start_tunnel "$bin" "$name" "$(p $((k + 1)))" "${name%@base}" "127.0.0.1:$(p $k)"
  k=$((k + 2))
done
for name in "${!port[@]}"; do wait_listen "${port[$name]}"; done
for name in "${runs[@]}"; do wait_listen "${serve_port[$name]}"; done

env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs; $("$VLINK" version | head -1); $(iperf3 --version | head -1)"
echo "$env_line" >&2
paths=(direct tcp "${runs[@]}")
for rep in $(seq "$REPS"); do
  n=${#paths[@]}
  for i in $(seq 0 $((n - 1))); do
    path=${paths[$(( (i + rep) % n ))]}
    t0=0 s0=0
    [ -z "${tunnel[$path]:-}" ] || t0=$(cpu_ticks "${tunnel[$path]}")
    [ -z "${serve[$path]:-}" ] || s0=$(cpu_ticks "${serve[$path]}")
    if [ -n "$PERF" ] && [ "$rep" = 1 ]; then
      [ -z "${tunnel[$path]:-}" ] || perf_record "$PERF/$path-tunnel.data" "${tunnel[$path]}" "$DURATION"
      [ -z "${serve[$path]:-}" ] || perf_record "$PERF/$path-serve.data" "${serve[$path]}" "$DURATION"
    fi
    "${ends_cpu[@]}" iperf3 -c 127.0.0.1 -p "${port[$path]}" -t "$DURATION" --json >"$work/$path-$rep.json" || true
    perf_wait
    t1=0 s1=0
    [ -z "${tunnel[$path]:-}" ] || t1=$(cpu_ticks "${tunnel[$path]}")
    [ -z "${serve[$path]:-}" ] || s1=$(cpu_ticks "${serve[$path]}")
    echo "$((t1 - t0)) $((s1 - s0))" >"$work/$path-$rep.cpu"
    echo "rep $rep $path: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%.2f Gbit/s" % (r["end"]["sum_received"]["bits_per_second"]/1e9) if "end" in r and "sum_received" in r["end"] else r.get("error"))' "$work/$path-$rep.json")" >&2
  done
done

[ -z "$PIN" ] || env_line+="; PIN: vlink on CPU 1, iperf3 on CPU 0"
echo "$env_line"
python3 - "$work" "$REPS" "$DURATION" "$(getconf CLK_TCK)" "${paths[@]}" <<'PY'
import json, statistics, sys
import targets
work, reps, duration, hz, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5:]
med, rng, cpu = {}, {}, {}
for p in paths:
    runs, tun, srv, ends = [], [], [], []
    for rep in range(1, reps + 1):
        r = json.load(open(f"{work}/{p}-{rep}.json"))
        if "error" in r:
            sys.exit(f"{p} run {rep}: iperf3 error: {r['error']}")
        s = r["end"]["sum_received"]
        runs.append(s["bits_per_second"] / 1e9)
        t, v = (int(x) for x in open(f"{work}/{p}-{rep}.cpu").read().split())
        gb = s["bytes"] / 1e9
        tun.append(t / hz / gb)
        srv.append(v / hz / gb)
        u = r["end"]["cpu_utilization_percent"]
        ends.append((u["host_total"] + u["remote_total"]) / 100 * s["seconds"] / gb)
    med[p], rng[p] = statistics.median(runs), (min(runs), max(runs))
    cpu[p] = (statistics.median(tun), statistics.median(srv), statistics.median(ends))
print(f"## iperf3 -t {duration}, one stream, {reps} interleaved rounds, median (min..max); CPU = CPU seconds per GB of each vlink process, and of the two iperf3 ends together")
ident = med.get("identity")
print(f"{'path':<14} {'Gbit/s':>7}  {'min..max':>13}  {'x identity':>10}  {'x direct':>8}  {'tunnel s/GB':>11}  {'serve s/GB':>10}  {'iperf3 s/GB':>11}")
for p in paths:
    xi = f"{med[p] / ident:.2f}" if ident else "-"
    t = "-" if p == "direct" else f"{cpu[p][0]:.3f}"
    v = "-" if p in ("direct", "tcp") else f"{cpu[p][1]:.3f}"
    print(f"{p:<14} {med[p]:7.2f}  {rng[p][0]:6.2f}..{rng[p][1]:6.2f}  {xi:>10}  {med[p] / med['direct']:8.2f}  {t:>11}  {v:>10}  {cpu[p][2]:11.3f}")
for p in paths:
    if p.endswith("@base"):
        q = p[:-5]
        print(f"{q}: {med[q] / med[p]:.2f}x its base; CPU per GB, tunnel {cpu[q][0] / cpu[p][0]:.2f}x, serve {cpu[q][1] / cpu[p][1]:.2f}x, all processes {sum(cpu[q]) / sum(cpu[p]):.2f}x")
targets.check("tcp relay / direct", med["tcp"] / med["direct"], ">=", 0.9)
for p in paths:
    if ident and p not in ("direct", "tcp", "identity") and not p.endswith("@base"):
        targets.check(f"{p} / identity", med[p] / ident, ">=", 0.95 if p == "adaptive" else 0.9)
        # And what it costs (issue 40, point 3): on incompressible bytes
        # adaptive within 1.15x identity's CPU per GB in each process, a
        # fixed codec within 1.5x.
        limit = 1.15 if p == "adaptive" else 1.5
        for i, who in ((0, "tunnel"), (1, "serve")):
            targets.check(f"{p} / identity, CPU s/GB of {who}", cpu[p][i] / cpu["identity"][i], "<=", limit)
PY
