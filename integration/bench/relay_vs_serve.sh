#!/usr/bin/env bash
# Bytes through a vlink network's relay against the same stack through a
# vlink serve: iperf3 on loopback through
#
#   direct      iperf3 client -> iperf3 server
#   serve       client -> vlink tunnel --stack noise --key-file K
#                      -> vlink serve --key-file K --target server
#   relay       client -> vlink tunnel --to web.vlink.alt:PORT --stack noise+relay --node laptop
#                      -> vlink relay (zero-copy) -> vlink serve --node web -> server
#
# Both vlink paths run the noise layer end to end, one stream each. In
# the same run, REPS rounds, the paths interleaved and rotated each
# round. Prints the median Gbit/s (min..max) and the CPU seconds per GB of
# the vlink processes on the path, and checks the target of issue 11:
# relay >= 0.8x serve, and issue 40's: at most 1.5x serve's CPU per GB.
#
# Needs iperf3 and python3 (integration/deps.sh installs them).
#
# Environment: DURATION (iperf3 -t, default 5), REPS (default 3), VLINK
# (a vlink binary; default: built from this checkout), PORT_BASE (default
# 25500; uses PORT_BASE+1..+6).
DURATION=${DURATION:-5}
REPS=${REPS:-3}
PORT_BASE=${PORT_BASE:-25500}
. "$(dirname "$0")/lib.sh"
need iperf3 python3
build_vlink

need_ports 6
iperf_port=$(p 1) serve_port=$(p 2) relay_port=$(p 3) node_port=$(p 4)

iperf3 -s -B 127.0.0.1 -p "$iperf_port" >"$work/iperf3.log" 2>&1 &
pids+=($!)
"$VLINK" key --out "$work/network.key"
"$VLINK" key --node web --key-file "$work/network.key" --out "$work/web.key"
"$VLINK" key --node laptop --key-file "$work/network.key" --out "$work/laptop.key"
"$VLINK" key --out "$work/key"
"$VLINK" relay --listen "127.0.0.1:$relay_port" --key-file "$work/network.key" --log-level warn 2>"$work/relay.log" &
pids+=($!) relay_pid=$!
"$VLINK" serve --listen "127.0.0.1:$serve_port" --target "127.0.0.1:$iperf_port" --key-file "$work/key" --log-level warn 2>"$work/serve.log" &
pids+=($!) serve_pid=$!
"$VLINK" serve --listen "127.0.0.1:$node_port" --node web --relay "127.0.0.1:$relay_port" --node-key-file "$work/web.key" \
  --allow "localhost:$iperf_port" --log-level warn 2>"$work/node.log" &
pids+=($!) node_pid=$!
for port in "$iperf_port" "$serve_port" "$relay_port" "$node_port"; do wait_listen "$port"; done

declare -A port procs
"$VLINK" tunnel --listen "127.0.0.1:$(p 5)" --to "127.0.0.1:$serve_port" --stack noise --key-file "$work/key" --log-level warn &
pids+=($!)
port[serve]=$(p 5) procs[serve]="$! $serve_pid"
# noise+relay: the relayed path only. With the network choosing, the two
# nodes on one host reach each other directly (reverse or spliced), and
# the relay carries nothing.
"$VLINK" tunnel --listen "127.0.0.1:$(p 6)" --to "web.vlink.alt:$iperf_port" --stack noise+relay \
  --node laptop --relay "127.0.0.1:$relay_port" --node-key-file "$work/laptop.key" --log-level warn &
pids+=($!)
port[relay]=$(p 6) procs[relay]="$! $relay_pid $node_pid"
port[direct]=$iperf_port procs[direct]=""
for name in "${!port[@]}"; do wait_listen "${port[$name]}"; done

ticks_of() { # path
  local t=0 pid
  for pid in ${procs[$1]}; do t=$((t + $(cpu_ticks_all "$pid"))); done
  echo "$t"
}

env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs; $("$VLINK" version | head -1); $(iperf3 --version | head -1)"
echo "$env_line" >&2
paths=(direct serve relay)
for rep in $(seq "$REPS"); do
  n=${#paths[@]}
  for i in $(seq 0 $((n - 1))); do
    path=${paths[$(( (i + rep) % n ))]}
    before=$(ticks_of "$path") relay_before=$(cpu_ticks_all "$relay_pid")
    iperf3 -c 127.0.0.1 -p "${port[$path]}" -t "$DURATION" --json >"$work/$path-$rep.json" || true
    echo $(( $(ticks_of "$path") - before )) >"$work/$path-$rep.cpu"
    echo $(( $(cpu_ticks_all "$relay_pid") - relay_before )) >"$work/$path-$rep.relaycpu"
    echo "rep $rep $path: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%.2f Gbit/s" % (r["end"]["sum_received"]["bits_per_second"]/1e9) if "end" in r and "sum_received" in r["end"] else r.get("error"))' "$work/$path-$rep.json")" >&2
  done
done

echo "$env_line"
python3 - "$work" "$REPS" "$DURATION" "$(getconf CLK_TCK)" <<'PY'
import json, statistics, sys
import targets
work, reps, duration, hz = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
paths = ["direct", "serve", "relay"]
med, rng, cpu, relay_cpu = {}, {}, {}, []
for p in paths:
    runs, per_gb = [], []
    for rep in range(1, reps + 1):
        r = json.load(open(f"{work}/{p}-{rep}.json"))
        if "error" in r:
            sys.exit(f"{p} run {rep}: iperf3 error: {r['error']}")
        s = r["end"]["sum_received"]
        runs.append(s["bits_per_second"] / 1e9)
        per_gb.append(int(open(f"{work}/{p}-{rep}.cpu").read()) / hz / (s["bytes"] / 1e9))
        if p == "relay":
            relay_cpu.append(int(open(f"{work}/{p}-{rep}.relaycpu").read()) / hz / (s["bytes"] / 1e9))
    med[p], rng[p] = statistics.median(runs), (min(runs), max(runs))
    cpu[p] = statistics.median(per_gb)
print(f"## iperf3 -t {duration}, one stream, {reps} interleaved rounds, median (min..max); CPU = CPU seconds per GB of the vlink processes on the path")
print(f"{'path':<8} {'Gbit/s':>7}  {'min..max':>13}  {'x direct':>8}  {'CPU s/GB':>8}")
for p in paths:
    c = "-" if p == "direct" else f"{cpu[p]:.2f}"
    print(f"{p:<8} {med[p]:7.2f}  {rng[p][0]:6.2f}..{rng[p][1]:6.2f}  {med[p] / med['direct']:8.2f}  {c:>8}")
print(f"relay / serve = {med['relay'] / med['serve']:.2f}; CPU per GB relay / serve = {cpu['relay'] / cpu['serve']:.2f}; the relay process alone: {statistics.median(relay_cpu):.2f} s/GB")
if statistics.median(relay_cpu) < 0.01:
    sys.exit("the relay process spent no CPU on the relayed path: its bytes went another way")
targets.check("relayed / vlink serve, same stack (noise)", med['relay'] / med['serve'], ">=", 0.8)
# The relay splices the ciphertext: what it adds is the kernel's work for
# one more loopback hop, less than either encrypting end.
targets.check("relayed / vlink serve, CPU s/GB of the vlink processes on the path", cpu['relay'] / cpu['serve'], "<=", 1.5)
PY
