#!/usr/bin/env bash
# DNS queries per second through SOCKS5 UDP ASSOCIATE: a Python resolver
# loop (QUERIES queries of one name, one in flight, on one socket) against
# dnsmasq on loopback,
#
#   direct   the program to dnsmasq
#   socks    the program under Dante's socksify -> vlink socks (no stack:
#            the datagrams leave from vlink socks) -> dnsmasq
#   STACK    the program under socksify -> vlink socks --stack STACK --via
#            -> vlink serve --allow-udp -> dnsmasq
#
# REPS rounds, the paths interleaved. Prints the median queries per second
# (min..max), the ratio to direct, and the CPU each vlink process spent
# per query (µs, median). No target: the issue asks for the figure.
#
# Needs dnsmasq, python3 and socksify (integration/deps.sh installs them).
#
# Environment: QUERIES (default 2000), REPS (default 3), STACKS (default
# zstd), VLINK, PORT_BASE (default 25800).
QUERIES=${QUERIES:-2000}
REPS=${REPS:-3}
STACKS=${STACKS:-zstd}
PORT_BASE=${PORT_BASE:-25800}
. "$(dirname "$0")/lib.sh"
need dnsmasq python3 socksify
build_vlink
read -ra stacks <<<"$STACKS"
need_ports $((3 + 2 * ${#stacks[@]}))
dns=$(p 1)
dnsmasq --keep-in-foreground --log-facility=- --conf-file=/dev/null --pid-file --port "$dns" \
  --listen-address 127.0.0.1 --bind-interfaces --no-resolv --no-hosts --address=/example.test/192.0.2.7 \
  >"$work/dnsmasq.log" 2>&1 &
pids+=($!)
declare -A socks_port socks_pid serve_pid
"$VLINK" socks --listen "127.0.0.1:$(p 2)" --log-level warn 2>>"$work/socks.log" &
pids+=($!) socks_pid[socks]=$!
socks_port[socks]=$(p 2)
k=3
for s in "${stacks[@]}"; do
  "$VLINK" serve --listen "127.0.0.1:$(p $k)" --allow-udp "127.0.0.1:$dns" --log-level warn 2>>"$work/serve.log" &
  pids+=($!) serve_pid[$s]=$!
  "$VLINK" socks --listen "127.0.0.1:$(p $((k + 1)))" --stack "$s" --via "127.0.0.1:$(p $k)" --log-level warn 2>>"$work/socks.log" &
  pids+=($!) socks_pid[$s]=$!
  socks_port[$s]=$(p $((k + 1)))
  wait_listen "$(p $k)"
  k=$((k + 2))
done
for s in "${!socks_port[@]}"; do wait_listen "${socks_port[$s]}"; done
sleep 0.3 # dnsmasq logs nothing we wait for

cat >"$work/q.py" <<'PY'
import socket, struct, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"\x03www\x07example\x04test\x00" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
for _ in range(20):  # warm-up: the association and its session
    s.sendto(q, ("127.0.0.1", port)); s.recvfrom(512)
t = time.perf_counter()
for _ in range(n):
    s.sendto(q, ("127.0.0.1", port))
    r, _ = s.recvfrom(512)
    assert r[-4:] == bytes([192, 0, 2, 7]), r
print(n / (time.perf_counter() - t))
PY
query() { # path
  if [ "$1" = direct ]; then
    python3 "$work/q.py" "$dns" "$QUERIES"
    return
  fi
  printf 'route {\n from: 0.0.0.0/0 to: 0.0.0.0/0 via: 127.0.0.1 port = %s\n proxyprotocol: socks_v5\n protocol: udp tcp\n method: none\n}\n' \
    "${socks_port[$1]}" >"$work/dante-$1.conf"
  SOCKS_CONF="$work/dante-$1.conf" SOCKS_AUTOADD_LANROUTES=no socksify python3 "$work/q.py" "$dns" "$QUERIES"
}
env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs; $("$VLINK" version | head -1); $(dnsmasq --version | head -1)"
echo "$env_line" >&2
paths=(direct socks "${stacks[@]}")
for rep in $(seq "$REPS"); do
  n=${#paths[@]}
  for i in $(seq 0 $((n - 1))); do
    path=${paths[$(( (i + rep) % n ))]}
    c0=$(cpu_ticks ${socks_pid[$path]:-}) s0=$(cpu_ticks ${serve_pid[$path]:-})
    qps=$(query "$path")
    c1=$(cpu_ticks ${socks_pid[$path]:-}) s1=$(cpu_ticks ${serve_pid[$path]:-})
    echo "$path $qps $((c1 - c0)) $((s1 - s0))" >>"$work/qps"
    echo "rep $rep $(tail -1 "$work/qps")" >&2
  done
done
echo "$env_line"
python3 - "$work/qps" "$QUERIES" "$REPS" "$(getconf CLK_TCK)" "${paths[@]}" <<'PY'
import collections, statistics, sys
runs, cpu = collections.defaultdict(list), collections.defaultdict(list)
queries, hz = int(sys.argv[2]), int(sys.argv[4])
for line in open(sys.argv[1]):
    p, q, c, s = line.split()
    runs[p].append(float(q))
    # The warm-up's 20 queries count too; the clock ticks are coarse.
    cpu[p].append([int(c) / hz / (queries + 20) * 1e6, int(s) / hz / (queries + 20) * 1e6])
print(f"## DNS queries per second, {queries} queries one at a time, {sys.argv[3]} interleaved rounds, median (min..max);")
print("## CPU µs per query of vlink socks and of vlink serve, median (clock ticks of 1/%d s)" % hz)
d = statistics.median(runs["direct"])
for p in sys.argv[5:]:
    m = statistics.median(runs[p])
    line = f"{p:<8} {m:8.0f}  ({min(runs[p]):.0f}..{max(runs[p]):.0f})  {m / d:5.3f}x direct"
    if p != "direct":
        socks = statistics.median(c[0] for c in cpu[p])
        line += f"  CPU socks {socks:5.1f} µs"
        if p != "socks":
            line += f", serve {statistics.median(c[1] for c in cpu[p]):5.1f} µs"
    print(line)
PY
