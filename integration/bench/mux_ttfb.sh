#!/usr/bin/env bash
# Time to first byte of short connections over a 50 ms lab link, with and
# without the mux layer, measured in the same run with the paths
# interleaved connection by connection.
#
# The server namespace runs python3's http.server and "vlink serve" in
# front of it; the client namespace runs one "vlink tunnel" per stack.
# Each of N rounds fetches a 1 KiB file once through every tunnel with a
# new curl process (one new TCP connection to its tunnel, and a new
# connection through the stack), and records curl's time_starttransfer.
# Without mux every connection pays the stack's setup over the link (a TCP
# handshake, the hello, parallel substreams...); with mux only the first
# does, and later ones open a stream whose hello travels with the request.
#
# Prints per stack the median and 90th percentile TTFB of connections
# 2..N, the first connection's, and the ratio with mux to without.
#
# Needs root. Environment: PROFILE (default wan50-clean: 1 Gbit/s, 50 ms
# RTT, no loss), N (default 100), VLINK and VLINK_LAB (binaries; default:
# built from this checkout).
PROFILE=${PROFILE:-wan50-clean}
N=${N:-100}
. "$(dirname "$0")/lib.sh"
need_root "network namespaces"
need curl python3
build_vlink
build_vlink_lab

out=$("$VLINK_LAB" up --detach "$PROFILE")
lab_id=$(sed -n 's/.*vlink-lab down \([0-9-]*\).*/\1/p' <<<"$out" | head -1)
server=10.77.0.2

mkdir -p "$work/www"
head -c 1024 /dev/urandom >"$work/www/small"
lab_start server python3 -m http.server 8000 --bind 127.0.0.1 --directory "$work/www" >/dev/null
lab_wait_port server 8000
lab_start server "$VLINK" serve --listen "$server:7000" --target 127.0.0.1:8000 --log-level warn >/dev/null
lab_wait_port server 7000

# stack pairs: without mux, then with it.
stacks=(tcp mux zstd zstd+mux parallel:streams=4 mux+parallel:streams=4)
declare -A port=()
p=8300
for s in "${stacks[@]}"; do
  p=$((p + 1))
  port[$s]=$p
  lab_start client "$VLINK" tunnel --listen "127.0.0.1:$p" --to "$server:7000" --stack "$s" --log-level warn >/dev/null
  lab_wait_port client "$p"
done

want=$(sha256sum <"$work/www/small" | cut -d' ' -f1)
results=$work/ttfb.txt
: >"$results"
echo "== $PROFILE: $N rounds over ${#stacks[@]} stacks" >&2
for i in $(seq "$N"); do
  for s in "${stacks[@]}"; do
    t=$(lab client curl -s -o "$work/got" -w '%{time_starttransfer}' "http://127.0.0.1:${port[$s]}/small")
    got=$(sha256sum <"$work/got" | cut -d' ' -f1)
    [ "$got" = "$want" ] || { echo "$s: round $i fetched something else" >&2; exit 1; }
    echo "$s $i $t" >>"$results"
  done
  [ $((i % 10)) -eq 0 ] && echo "  $i/$N" >&2
done

python3 - "$results" "${stacks[@]}" <<'PY'
import statistics, sys
path, stacks = sys.argv[1], sys.argv[2:]
t = {s: {} for s in stacks}
for line in open(path):
    s, i, v = line.split()
    t[s][int(i)] = float(v) * 1000
def q(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))]
med = {}
print(f"  {'stack':<24} {'TTFB ms, 2..N: median':>22} {'p90':>7} {'1st':>7}")
for s in stacks:
    rest = [v for i, v in t[s].items() if i > 1]
    med[s] = statistics.median(rest)
    print(f"  {s:<24} {med[s]:22.1f} {q(rest, 0.9):7.1f} {t[s][1]:7.1f}")
for a, b in zip(stacks[::2], stacks[1::2]):
    print(f"  {b} / {a}: {med[b] / med[a]:.2f} of the median TTFB")
PY
