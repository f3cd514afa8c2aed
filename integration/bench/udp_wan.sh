#!/usr/bin/env bash
# Datagrams on the WAN lab: iperf3 -u (1400-byte datagrams, RATE offered)
# from the lab's client to its server,
#
#   direct       straight over the lab link, as UDP
#   tcp          iperf3 -> vlink tunnel --udp -> vlink serve --allow-udp
#                -> iperf3: the datagrams ride one TCP flow per session
#   parallel-8   the same with --stack parallel:streams=8
#   quic         the same with --stack quic (serve --quic): the datagrams
#                that fit a packet ride QUIC datagrams (RFC 9221)
#
# on each lab profile, REPS rounds, the paths shuffled each round. Prints
# the median delivered Mbit/s and loss (min..max) per path, and the CPU
# seconds per GB delivered of vlink tunnel and of vlink serve (median). The point: a
# stream stack delivers every datagram it takes, in order, at the rate a
# TCP flow gets on the path; on a lossy long path that is far below the
# offered rate, and the rest is dropped at the tunnel's queue. QUIC
# datagrams carry them at the rate QUIC's congestion control allows,
# losing what the path loses, alone.
#
# Needs root (network namespaces). Environment: PROFILES (default "wan50
# wan50-clean"), RATE (default 100M), DURATION (default 10), REPS
# (default 3), LEN (iperf3 -l, default 1400), VLINK and VLINK_LAB (default: built from this checkout).
PROFILES=${PROFILES:-"wan50 wan50-clean"}
RATE=${RATE:-100M}
DURATION=${DURATION:-10}
REPS=${REPS:-3}
LEN=${LEN:-1400}
. "$(dirname "$0")/lib.sh"
need_root "network namespaces"
need iperf3 python3
build_vlink
build_vlink_lab

results=$work/results.txt
: >"$results"
for profile in $PROFILES; do
  lab_up "$profile"
  serve=$(lab_start server "$VLINK" serve --listen "$server:7000" --quic --allow "127.0.0.1:5201" --allow-udp "127.0.0.1:5201" --log-level warn)
  lab_wait_port server 7000
  declare -A port=([tcp]=8101 [parallel-8]=8108 [quic]=8109)
  declare -A stack=([tcp]=tcp [parallel-8]=parallel:streams=8 [quic]=quic)
  tunnels=()
  declare -A tunnel
  for path in tcp parallel-8 quic; do
    f=$work/$path.toml
    : >"$f"
    for udp in false true; do
      printf '[[forward]]\nudp = %s\nlisten = "127.0.0.1:%s"\nvia = "%s:7000"\nto = "127.0.0.1:5201"\nstack = "%s"\n\n' \
        "$udp" "${port[$path]}" "$server" "${stack[$path]}" >>"$f"
    done
    tunnel[$path]=$(lab_start client "$VLINK" tunnel --forwards "$f" --log-level warn)
    tunnels+=("${tunnel[$path]}")
    lab_wait_port client "${port[$path]}"
  done
  echo "== $profile: $REPS rounds of ${DURATION}s at $RATE offered" >&2
  for rep in $(seq "$REPS"); do
    for path in $(printf '%s\n' direct tcp parallel-8 quic | shuf); do
      case $path in
        direct) args=(-c "$server" -p 5201) ;;
        *) args=(-c 127.0.0.1 -p "${port[$path]}") ;;
      esac
      t0=$(cpu_ticks ${tunnel[$path]:-}) s0=0
      [ "$path" = direct ] || s0=$(cpu_ticks "$serve")
      lab client iperf3 -J -u -b "$RATE" -l "$LEN" -t "$DURATION" "${args[@]}" >"$work/run.json" || true
      t1=$(cpu_ticks ${tunnel[$path]:-}) s1=0
      [ "$path" = direct ] || s1=$(cpu_ticks "$serve")
      python3 - "$profile" "$path" "$work/run.json" $((t1 - t0)) $((s1 - s0)) "$(getconf CLK_TCK)" >>"$results" <<'PY' || echo "$profile $path: iperf3 failed" >&2
import json, sys
r = json.load(open(sys.argv[3]))
if "error" in r:
    sys.exit(r["error"])
recv = r["end"]["sum_received"]
gb = recv.get("bytes", recv["bits_per_second"] * recv["seconds"] / 8) / 1e9
hz = int(sys.argv[6])
print(sys.argv[1], sys.argv[2], recv["bits_per_second"] / 1e6, r["end"]["sum"]["lost_percent"], int(sys.argv[4]) / hz / gb, int(sys.argv[5]) / hz / gb)
PY
      printf '  %-12s %s\n' "$path" "$(tail -1 "$results" | awk '{printf "%.1f Mbit/s, %.2f%% lost", $3, $4}')" >&2
    done
  done
  kill "$serve" "${tunnels[@]}" 2>/dev/null || true
  lab_down
  unset port stack tunnel
done

echo "# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs; $("$VLINK" version | head -1); iperf3 -u -b $RATE -l $LEN -t $DURATION, $REPS rounds"
python3 - "$results" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    profile, path, mbit, lost, tun, srv = line.split()
    rows[(profile, path)].append((float(mbit), float(lost), float(tun), float(srv)))
print(f"{'profile':<12} {'path':<11} {'Mbit/s':>7}  {'min..max':>13}  {'lost %':>6}  {'min..max':>13}  {'CPU s/GB tunnel':>15} {'serve':>6}")
for (profile, path), v in rows.items():
    m, l = [x[0] for x in v], [x[1] for x in v]
    cpu = "" if path == "direct" else f"  {statistics.median(x[2] for x in v):15.2f} {statistics.median(x[3] for x in v):6.2f}"
    print(f"{profile:<12} {path:<11} {statistics.median(m):7.1f}  {min(m):6.1f}..{max(m):6.1f}  {statistics.median(l):6.2f}  {min(l):6.2f}..{max(l):6.2f}{cpu}")
PY
