#!/usr/bin/env bash
# The preload shim's cost, every figure against a baseline measured in the
# same run, interleaved (the order rotates each repetition) so that a noisy
# machine affects all alike:
#
#   1. iperf3 on loopback, plain, against iperf3 under "vlink exec" with a
#      direct rule (loopback under --stack): the shim decides, the kernel
#      carries the bytes. Target: >= 0.98x. The plain path is measured twice
#      ("plain-again") to show how far two runs of the same path differ.
#   2. connect(2) latency: connlat.c, CONNECTS blocking connects to a local
#      listener, plain and under the shim (the verdict for the destination
#      cached after the first connect), and under the shim with the cache
#      off (VLINK_PRELOAD_CACHE=0: every connect asks the agent, as a first
#      contact with a destination does). Target: median added <= 50 us.
#   3. iperf3 through a zstd stack to vlink serve, under "vlink exec" (the
#      agent relays the program's loopback connection) against the same
#      stack through "vlink tunnel". Target: >= 0.9x.
#
# CPU: the iperf3 client's own CPU per GB in 1 (the shim adds no call on
# the data path: target <= 1.1x plain's), and in 3 the CPU per GB of the
# relaying vlink process, the agent (vlink exec's own, its iperf3 taken
# out) against the tunnel (target <= 1.1x), and of vlink serve.
#
# Environment: DURATION (iperf3 -t, default 5), REPS (default 5), CONNECTS
# (default 10000), VLINK (a vlink binary; default: built from this
# checkout), PORT_BASE (default 25300; uses PORT_BASE+1..+3).

DURATION=${DURATION:-5}
REPS=${REPS:-5}
CONNECTS=${CONNECTS:-10000}
PORT_BASE=${PORT_BASE:-25300}
. "$(dirname "$0")/lib.sh"
need iperf3 python3 cc
build_vlink
cc -O2 -Wall -Wextra -o "$work/connlat" "$root/integration/bench/connlat.c" -pthread

srv=$((PORT_BASE + 1)) gw=$((PORT_BASE + 2)) tun=$((PORT_BASE + 3))
iperf3 -s -B 127.0.0.1 -p "$srv" >"$work/iperf3-server.log" 2>&1 &
pids+=($!)
"$VLINK" serve --listen "127.0.0.1:$gw" --allow "127.0.0.1:$srv" --log-level warn &
pids+=($!) serve_pid=$!
"$VLINK" tunnel --listen "127.0.0.1:$tun" --via "127.0.0.1:$gw" --to "127.0.0.1:$srv" --stack zstd --log-level warn &
pids+=($!) tunnel_pid=$!
for p in "$srv" "$gw" "$tun"; do wait_listen "$p"; done
cat >"$work/zstd.toml" <<TOML
[[route]]
host = "127.0.0.1"
ports = "$srv"
stack = "zstd"
via = "127.0.0.1:$gw"
TOML
# The shim is built on first use; build it now, outside the timings.
"$VLINK" exec -- true

# Loopback stays direct under --stack: the shim asks the agent once, then
# connects by itself.
direct=("$VLINK" exec --stack zstd --via "127.0.0.1:$gw" --)
declare -A iperf=(
  [plain]="iperf3 -c 127.0.0.1 -p $srv"
  [plain-again]="iperf3 -c 127.0.0.1 -p $srv"
  [shim-direct]="${direct[*]} iperf3 -c 127.0.0.1 -p $srv"
  [tunnel-zstd]="iperf3 -c 127.0.0.1 -p $tun"
  [shim-zstd]="$VLINK exec --config $work/zstd.toml -- iperf3 -c 127.0.0.1 -p $srv"
)
declare -A lat=(
  [plain]="$work/connlat $CONNECTS"
  [shim]="${direct[*]} $work/connlat $CONNECTS"
  [shim-nocache]="env VLINK_PRELOAD_CACHE=0 ${direct[*]} $work/connlat $CONNECTS"
)
ipaths=(plain plain-again shim-direct tunnel-zstd shim-zstd)
lpaths=(plain shim shim-nocache)

env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs; $("$VLINK" version); $(iperf3 --version | head -1)"
echo "$env_line" >&2
for rep in $(seq "$REPS"); do
  for i in 0 1 2 3 4; do
    path=${ipaths[$(( (i + rep) % 5 ))]}
    s0=$(cpu_ticks "$serve_pid") t0=$(cpu_ticks "$tunnel_pid")
    # The CPU of the command and what it waited for (vlink exec: itself
    # and iperf3), from wait4.
    tree=$(python3 -c 'import os, subprocess, sys
p = subprocess.Popen(sys.argv[2:], stdout=open(sys.argv[1], "w"))
_, _, ru = os.wait4(p.pid, 0)
print(ru.ru_utime + ru.ru_stime)' "$work/iperf-$path-$rep.json" ${iperf[$path]} -t "$DURATION" --json)
    echo "$(($(cpu_ticks "$serve_pid") - s0)) $(($(cpu_ticks "$tunnel_pid") - t0)) $tree" >"$work/iperf-$path-$rep.cpu"
    echo "rep $rep iperf3 $path: $(python3 -c 'import json,sys; print("%.2f Gbit/s" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]/1e9))' "$work/iperf-$path-$rep.json")" >&2
  done
  for i in 0 1 2; do
    path=${lpaths[$(( (i + rep) % 3 ))]}
    ${lat[$path]} >"$work/lat-$path-$rep.txt"
    echo "rep $rep connect $path: $(cat "$work/lat-$path-$rep.txt")" >&2
  done
done

echo "$env_line"
python3 - "$work" "$REPS" "$DURATION" "$CONNECTS" "$(getconf CLK_TCK)" <<'PY'
import json, re, statistics, sys
import targets
work, reps, duration, connects, hz = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
def gbits(path):
    out = []
    for rep in range(1, reps + 1):
        r = json.load(open(f"{work}/iperf-{path}-{rep}.json"))
        if "error" in r:
            sys.exit(f"iperf3 {path} run {rep}: {r['error']}")
        out.append(r["end"]["sum_received"]["bits_per_second"] / 1e9)
    return out
print(f"iperf3 -t {duration} on loopback, {reps} runs each, median Gbit/s (min..max)")
med = {}
for path in ("plain", "plain-again", "shim-direct", "tunnel-zstd", "shim-zstd"):
    g = gbits(path)
    med[path] = statistics.median(g)
    print(f"  {path:<12} {med[path]:7.2f}  ({min(g):.2f}..{max(g):.2f})")
def paired(a, b):
    # Runs of one repetition are next to each other in time: their ratio
    # cancels most of the machine's drift.
    r = [x / y for x, y in zip(gbits(a), gbits(b))]
    return f"{statistics.median(r):.3f} ({min(r):.2f}..{max(r):.2f})"
print(f"  plain-again / plain       = {med['plain-again'] / med['plain']:.3f} of the medians; paired per run {paired('plain-again', 'plain')}  (the same path twice: the noise floor)")
print(f"  shim-direct / plain       = {med['shim-direct'] / med['plain']:.3f} of the medians; paired per run {paired('shim-direct', 'plain')}")
targets.check("shim-direct / plain", med['shim-direct'] / med['plain'], ">=", 0.98)
print(f"  shim-zstd / tunnel-zstd   = {med['shim-zstd'] / med['tunnel-zstd']:.3f} of the medians; paired per run {paired('shim-zstd', 'tunnel-zstd')}")
targets.check("shim-zstd / tunnel-zstd", med['shim-zstd'] / med['tunnel-zstd'], ">=", 0.9)
def cpu_per_gb(path):
    # The iperf3 client's own CPU (the process the shim is loaded into)
    # per GB sent: contention slows a run down but adds little CPU to it.
    out = []
    for rep in range(1, reps + 1):
        r = json.load(open(f"{work}/iperf-{path}-{rep}.json"))
        e = r["end"]
        secs = e["sum_sent"]["seconds"]
        out.append(e["cpu_utilization_percent"]["host_total"] / 100 * secs / (e["sum_sent"]["bytes"] / 1e9))
    return out
print("iperf3 client CPU seconds per GB sent, median (min..max)")
client = {}
for path in ("plain", "plain-again", "shim-direct"):
    c = cpu_per_gb(path)
    client[path] = statistics.median(c)
    print(f"  {path:<12} {statistics.median(c):.3f}  ({min(c):.3f}..{max(c):.3f})")
targets.check("shim-direct / plain, iperf3 client CPU s/GB", client['shim-direct'] / client['plain'], "<=", 1.1)
def relay_cpu(path):
    # CPU seconds per GB received: the relaying process (the tunnel, or
    # vlink exec's agent: the command's tree less iperf3's own), and serve.
    relay, serve = [], []
    for rep in range(1, reps + 1):
        e = json.load(open(f"{work}/iperf-{path}-{rep}.json"))["end"]
        gb = e["sum_received"]["bytes"] / 1e9
        s, t, tree = open(f"{work}/iperf-{path}-{rep}.cpu").read().split()
        own = e["cpu_utilization_percent"]["host_total"] / 100 * e["sum_sent"]["seconds"]
        relay.append((int(t) / hz if path == "tunnel-zstd" else float(tree) - own) / gb)
        serve.append(int(s) / hz / gb)
    return statistics.median(relay), statistics.median(serve)
print("CPU seconds per GB received of the vlink processes, median: the relay (tunnel or vlink exec's agent), serve")
relay = {}
for path in ("tunnel-zstd", "shim-zstd"):
    relay[path], serve = relay_cpu(path)
    print(f"  {path:<12} relay {relay[path]:.3f}  serve {serve:.3f}")
targets.check("shim-zstd / tunnel-zstd, relay CPU s/GB (agent / tunnel)", relay['shim-zstd'] / relay['tunnel-zstd'], "<=", 1.1)
print(f"connect(2) latency, {connects} connects per run, {reps} runs each: median of the runs' medians in us (min..max)")
m = {}
for path in ("plain", "shim", "shim-nocache"):
    meds, p99 = [], []
    for rep in range(1, reps + 1):
        t = open(f"{work}/lat-{path}-{rep}.txt").read()
        meds.append(float(re.search(r"median=([0-9.]+)", t).group(1)))
        p99.append(float(re.search(r"p99=([0-9.]+)", t).group(1)))
    m[path] = statistics.median(meds)
    print(f"  {path:<12} {m[path]:7.2f}  ({min(meds):.2f}..{max(meds):.2f})  p99 {statistics.median(p99):.1f}")
print(f"  added by the shim, cached verdict   = {m['shim'] - m['plain']:.2f} us")
targets.check("connect latency added by the shim, cached verdict", m['shim'] - m['plain'], "<=", 50, " us")
print(f"  added by the shim, asking the agent = {m['shim-nocache'] - m['plain']:.2f} us")
PY
