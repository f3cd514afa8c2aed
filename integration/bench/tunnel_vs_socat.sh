#!/usr/bin/env bash
# iperf3 throughput on loopback through three paths, measured in the same
# run and interleaved so that a noisy machine affects all alike:
#
#   direct  iperf3 client -> iperf3 server
#   socat   client -> socat TCP-LISTEN:...,fork,reuseaddr TCP:... -> server
#   vlink   client -> vlink tunnel --stack tcp (plain: zero-copy, splice(2)) -> server
#   vlink-gor  the same with --event-loop=false: each connection on
#           goroutines from its start, not moved there from the event loop
#
# Prints, per path and number of parallel streams, the median Gbit/s of
# REPS runs (min..max), the ratios against socat and direct, and the CPU
# time the relay process spent per GB relayed. Targets: vlink >= 1.5x
# socat's Gbit/s, at <= 0.5x its relay CPU per GB.
#
# Environment: DURATION (iperf3 -t, default 10), REPS (default 3), STREAMS
# (default "1 4"), VLINK (a vlink binary; default: built from this
# checkout), PORT_BASE (default 25200; uses PORT_BASE+1..+4).

DURATION=${DURATION:-10}
REPS=${REPS:-3}
STREAMS=${STREAMS:-"1 4"}
PORT_BASE=${PORT_BASE:-25200}
. "$(dirname "$0")/lib.sh"
need iperf3 socat python3
build_vlink

srv=$((PORT_BASE + 1)) socat_port=$((PORT_BASE + 2)) vlink_port=$((PORT_BASE + 3)) gor_port=$((PORT_BASE + 4))

iperf3 -s -B 127.0.0.1 -p "$srv" >"$work/iperf3-server.log" 2>&1 &
pids+=($!)
socat "TCP-LISTEN:$socat_port,bind=127.0.0.1,fork,reuseaddr" "TCP:127.0.0.1:$srv" 2>"$work/socat.log" &
pids+=($!) socat_pid=$!
"$VLINK" tunnel --listen "127.0.0.1:$vlink_port" --to "127.0.0.1:$srv" --stack tcp --log-level warn &
pids+=($!) vlink_pid=$!
"$VLINK" tunnel --listen "127.0.0.1:$gor_port" --to "127.0.0.1:$srv" --stack tcp --event-loop=false --log-level warn &
pids+=($!) gor_pid=$!
for p in "$srv" "$socat_port" "$vlink_port" "$gor_port"; do wait_listen "$p"; done

declare -A port=([direct]=$srv [socat]=$socat_port [vlink]=$vlink_port [vlink-gor]=$gor_port)
declare -A relay=([socat]=$socat_pid [vlink]=$vlink_pid [vlink-gor]=$gor_pid)
paths=(direct socat vlink vlink-gor)

env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs; $("$VLINK" version); $(iperf3 --version | head -1); socat $(socat -V | awk '/socat version/ {print $3}')"
echo "$env_line" >&2
for rep in $(seq "$REPS"); do
  for n in $STREAMS; do
    # Rotate the order each repetition.
    for i in 0 1 2 3; do
      path=${paths[$(( (i + rep) % 4 ))]}
      before=0
      [ -n "${relay[$path]:-}" ] && before=$(cpu_ticks_all "${relay[$path]}")
      iperf3 -c 127.0.0.1 -p "${port[$path]}" -t "$DURATION" -P "$n" --json >"$work/$path-$n-$rep.json"
      sleep 0.5 # let socat reap its children, so their CPU time is counted
      ticks=0
      [ -n "${relay[$path]:-}" ] && ticks=$(( $(cpu_ticks_all "${relay[$path]}") - before ))
      echo "$ticks" >"$work/$path-$n-$rep.cpu"
      echo "rep $rep -P $n $path: $(python3 -c 'import json,sys; print("%.2f Gbit/s" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]/1e9))' "$work/$path-$n-$rep.json")" >&2
    done
  done
done

echo "$env_line"
python3 - "$work" "$REPS" "$STREAMS" "$(getconf CLK_TCK)" "$DURATION" <<'EOF'
import json, statistics, sys
import targets
work, reps, streams, hz, duration = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), int(sys.argv[4]), sys.argv[5]
print(f"iperf3 -t {duration}, {reps} runs each, median (min..max); relay CPU = CPU seconds of the relay process per GB relayed")
print(f"{'streams':>7}  {'path':<9}  {'Gbit/s':>7}  {'min..max':>13}  {'x socat':>7}  {'x direct':>8}  {'relay CPU s/GB':>14}")
for n in streams:
    med, rng, cpu = {}, {}, {}
    for path in ("direct", "socat", "vlink", "vlink-gor"):
        runs, per_gb = [], []
        for rep in range(1, reps + 1):
            r = json.load(open(f"{work}/{path}-{n}-{rep}.json"))
            if "error" in r:
                sys.exit(f"{path} -P {n} run {rep}: iperf3 error: {r['error']}")
            s = r["end"]["sum_received"]
            runs.append(s["bits_per_second"] / 1e9)
            ticks = int(open(f"{work}/{path}-{n}-{rep}.cpu").read())
            per_gb.append(ticks / hz / (s["bytes"] / 1e9))
        med[path], rng[path] = statistics.median(runs), (min(runs), max(runs))
        cpu[path] = "-" if path == "direct" else f"{statistics.median(per_gb):.3f}"
    for path in ("direct", "socat", "vlink", "vlink-gor"):
        print(f"{n:>7}  {path:<9}  {med[path]:7.2f}  {rng[path][0]:6.2f}..{rng[path][1]:6.2f}  "
              f"{med[path] / med['socat']:7.2f}  {med[path] / med['direct']:8.2f}  {cpu[path]:>14}")
    targets.check(f"vlink / socat, -P {n}", med['vlink'] / med['socat'], ">=", 1.5)
    # The relay splices: its CPU per GB is the kernel's TCP work for the
    # second hop, where socat also copies through user space.
    targets.check(f"vlink / socat, relay CPU s/GB, -P {n}", float(cpu['vlink']) / float(cpu['socat']), "<=", 0.5)
EOF
