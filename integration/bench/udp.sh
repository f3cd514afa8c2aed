#!/usr/bin/env bash
# Datagrams through vlink: iperf3 -u (1400-byte datagrams, its payload is
# random) on loopback at each offered rate of RATES, through
#
#   direct   iperf3 client -> iperf3 server
#   STACK    client -> vlink tunnel (--udp for the datagrams, and a TCP
#            forward on the same port for iperf3's control connection)
#            -> vlink serve --quic --allow-udp -> server (a quic stack:
#            the datagrams that fit a packet ride QUIC datagrams)
#
# for each STACK of STACKS (default: tcp zstd), REPS rounds, the paths
# interleaved and rotated each round. Prints, per rate, the median
# delivered Mbit/s and loss (min..max), the ratio to direct, and the CPU
# seconds per GB delivered of each vlink process (tunnel, serve).
#
# Target of issue 39 over stream stacks: at 1 Gbit/s offered (when RATES
# holds 1G), each stack delivers >= 0.9x what direct UDP delivers; the
# loss it adds is reported, not targeted (see docs/GUIDE.md, Datagrams).
# Of issue 40: a codec's CPU per GB in each vlink process at most 1.5x
# the tcp stack's.
#
# Then a ping-pong: PINGS round trips of a 64-byte message, one at a time,
# UDP (a datagram to an echo server) and TCP (a byte stream to an echo
# server) through the same tunnel and serve, and UDP direct. Checks the
# target of issue 39: a datagram's round trip through the tunnel costs at
# most 2x a TCP round trip through it.
#
# Needs iperf3 and python3 (integration/deps.sh installs them).
#
# Environment: DURATION (iperf3 -t, default 5), REPS (default 3), RATES
# (default "100M 1G"), STACKS, PINGS (default 2000), VLINK (a vlink binary;
# default: built from this checkout), PORT_BASE (default 25700; uses
# PORT_BASE+1 and up, four ports per stack).
DURATION=${DURATION:-5}
REPS=${REPS:-3}
RATES=${RATES:-100M 1G}
STACKS=${STACKS:-tcp zstd}
PINGS=${PINGS:-2000}
PORT_BASE=${PORT_BASE:-25700}
. "$(dirname "$0")/lib.sh"
need iperf3 python3
build_vlink

read -ra stacks <<<"$STACKS"
read -ra rates <<<"$RATES"
need_ports $((3 + 4 * ${#stacks[@]}))
iperf_port=$(p 1) udp_echo=$(p 2) tcp_echo=$(p 3)
iperf3 -s -B 127.0.0.1 -p "$iperf_port" >"$work/iperf3.log" 2>&1 &
pids+=($!)
# Echo servers for the ping-pong, in one Python process.
python3 - "$udp_echo" "$tcp_echo" <<'PY' &
import socket, sys, threading
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.1", int(sys.argv[1])))
t = socket.socket()
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("127.0.0.1", int(sys.argv[2])))
t.listen(16)
def serve_tcp():
    while True:
        c, _ = t.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        def echo(c=c):
            while (b := c.recv(65536)):
                c.sendall(b)
        threading.Thread(target=echo, daemon=True).start()
threading.Thread(target=serve_tcp, daemon=True).start()
while True:
    b, a = u.recvfrom(65536)
    u.sendto(b, a)
PY
pids+=($!)

declare -A port tunnel serve
k=4
for s in "${stacks[@]}"; do
  gw=$(p $k) local=$(p $((k + 1))) echo_local=$(p $((k + 2)))
  "$VLINK" serve --listen "127.0.0.1:$gw" --quic --allow "127.0.0.1:$iperf_port,$tcp_echo" \
    --allow-udp "127.0.0.1:$iperf_port,$udp_echo" --log-level warn 2>>"$work/serve.log" &
  pids+=($!)
  serve[$s]=$!
  cat >"$work/$s.toml" <<TOML
[[forward]]
listen = "127.0.0.1:$local"
via = "127.0.0.1:$gw"
to = "127.0.0.1:$iperf_port"
stack = "$s"

[[forward]]
udp = true
listen = "127.0.0.1:$local"
via = "127.0.0.1:$gw"
to = "127.0.0.1:$iperf_port"
stack = "$s"

[[forward]]
listen = "127.0.0.1:$echo_local"
via = "127.0.0.1:$gw"
to = "127.0.0.1:$tcp_echo"
stack = "$s"

[[forward]]
udp = true
listen = "127.0.0.1:$echo_local"
via = "127.0.0.1:$gw"
to = "127.0.0.1:$udp_echo"
stack = "$s"
TOML
  "$VLINK" tunnel --forwards "$work/$s.toml" --log-level warn 2>>"$work/tunnel.log" &
  pids+=($!)
  tunnel[$s]=$! port[$s]=$local
  wait_listen "$gw"
  wait_listen "$local"
  wait_listen "$echo_local"
  k=$((k + 4))
done
port[direct]=$iperf_port
wait_listen "$iperf_port"
wait_listen "$tcp_echo"

env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs; $("$VLINK" version | head -1); $(iperf3 --version | head -1)"
echo "$env_line" >&2
paths=(direct "${stacks[@]}")
for rate in "${rates[@]}"; do
  for rep in $(seq "$REPS"); do
    n=${#paths[@]}
    for i in $(seq 0 $((n - 1))); do
      path=${paths[$(( (i + rep) % n ))]}
      t0=0 s0=0
      [ -z "${tunnel[$path]:-}" ] || t0=$(cpu_ticks "${tunnel[$path]}")
      [ -z "${serve[$path]:-}" ] || s0=$(cpu_ticks "${serve[$path]}")
      iperf3 -c 127.0.0.1 -p "${port[$path]}" -u -b "$rate" -l 1400 -t "$DURATION" --json >"$work/$path-$rate-$rep.json" || true
      t1=0 s1=0
      [ -z "${tunnel[$path]:-}" ] || t1=$(cpu_ticks "${tunnel[$path]}")
      [ -z "${serve[$path]:-}" ] || s1=$(cpu_ticks "${serve[$path]}")
      echo "$((t1 - t0)) $((s1 - s0))" >"$work/$path-$rate-$rep.cpu"
      echo "$rate rep $rep $path: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); s=r.get("end",{}).get("sum",{}); print("%.0f Mbit/s, %.2f%% lost" % (r["end"]["sum_received"]["bits_per_second"]/1e6, s.get("lost_percent",-1)) if "sum_received" in r.get("end",{}) else r.get("error"))' "$work/$path-$rate-$rep.json")" >&2
    done
  done
done

# Ping-pong: one message in flight at a time; the median round trip.
pingpong() { # kind port
  python3 - "$1" "$2" "$PINGS" <<'PY'
import socket, statistics, sys, time
kind, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if kind == "udp":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
else:
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
s.connect(("127.0.0.1", port))
s.settimeout(5)
msg = b"x" * 64
rtt = []
for i in range(n + 50):
    t = time.perf_counter()
    s.send(msg)
    got = 0
    while got < len(msg):
        got += len(s.recv(65536))
    if i >= 50:  # after the warm-up (the session's dial)
        rtt.append(time.perf_counter() - t)
print(statistics.median(rtt) * 1e6)
PY
}
for rep in $(seq "$REPS"); do
  echo "direct udp $(pingpong udp "$udp_echo")" >>"$work/ping"
  for s in "${stacks[@]}"; do
    e=$(( ${port[$s]} + 1 ))
    echo "$s udp $(pingpong udp "$e")" >>"$work/ping"
    echo "$s tcp $(pingpong tcp "$e")" >>"$work/ping"
  done
done

echo "$env_line"
python3 - "$work" "$REPS" "$DURATION" "$(getconf CLK_TCK)" "$RATES" "${paths[@]}" <<'PY'
import collections, json, statistics, sys
import targets
work, reps, duration, hz, rates, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5].split(), sys.argv[6:]
print(f"## iperf3 -u -l 1400 -t {duration}, {reps} interleaved rounds per offered rate, median (min..max); CPU = CPU seconds per GB delivered of each vlink process")
print(f"{'offered':<8} {'path':<8} {'Mbit/s':>7}  {'min..max':>11}  {'x direct':>8}  {'lost %':>7}  {'min..max':>11}  {'tunnel s/GB':>11}  {'serve s/GB':>10}")
checks, cpu = [], {}
for rate in rates:
    med = {}
    for p in paths:
        rx, lost, tun, srv = [], [], [], []
        for rep in range(1, reps + 1):
            r = json.load(open(f"{work}/{p}-{rate}-{rep}.json"))
            if "error" in r:
                sys.exit(f"{p} at {rate}, run {rep}: iperf3 error: {r['error']}")
            s = r["end"]["sum_received"]
            rx.append(s["bits_per_second"] / 1e6)
            lost.append(r["end"]["sum"]["lost_percent"])
            t, v = (int(x) for x in open(f"{work}/{p}-{rate}-{rep}.cpu").read().split())
            gb = s["bytes"] / 1e9
            tun.append(t / hz / gb)
            srv.append(v / hz / gb)
        med[p] = statistics.median(rx)
        cpu[(rate, p)] = (statistics.median(tun), statistics.median(srv))
        d = med[p] / med["direct"]
        t = "-" if p == "direct" else f"{statistics.median(tun):.2f}"
        v = "-" if p == "direct" else f"{statistics.median(srv):.2f}"
        if rate == "1G" and p != "direct":
            checks.append((f"{p} at 1G offered: delivered / direct", d))
        print(f"{rate:<8} {p:<8} {med[p]:7.0f}  {min(rx):5.0f}..{max(rx):5.0f}  {d:8.2f}  {statistics.median(lost):7.2f}  {min(lost):5.2f}..{max(lost):5.2f}  {t:>11}  {v:>10}")
ping = collections.defaultdict(list)
for line in open(f"{work}/ping"):
    p, kind, us = line.split()
    ping[(p, kind)].append(float(us))
print(f"## ping-pong, 64 bytes, one in flight, median round trip of {reps} rounds (min..max of the rounds' medians), µs")
for (p, kind), v in ping.items():
    print(f"{p:<8} {kind}  {statistics.median(v):7.1f}  ({min(v):.1f}..{max(v):.1f})")
for name, d in checks:
    targets.check(name, d, ">=", 0.9)
# A codec on iperf3's random payload costs at most 1.5x the plain
# stack's CPU per GB in each process, as for streams (datapath.sh).
for rate in rates:
    for p in paths[1:]:
        if p == "tcp" or "quic" in p or (rate, "tcp") not in cpu:
            continue
        for i, proc in enumerate(("tunnel", "serve")):
            targets.check(f"{p} / tcp at {rate} offered, CPU s/GB of {proc}", cpu[(rate, p)][i] / cpu[(rate, "tcp")][i], "<=", 1.5)
for p in paths[1:]:
    u, t = statistics.median(ping[(p, "udp")]), statistics.median(ping[(p, "tcp")])
    targets.check(f"{p}: UDP round trip / TCP round trip through the tunnel", u / t, "<=", 2.0)
PY
