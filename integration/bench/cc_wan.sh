#!/usr/bin/env bash
# Congestion control on the WAN lab: iperf3 through vlink tunnel -> vlink
# serve with the kernel's default congestion control and with
# tcp:cc=bbr, against iperf3 straight over the link with -C cubic and
# -C bbr, on each lab profile, the paths shuffled each round.
#
#   cubic, bbr         iperf3 -C ALG, straight over the link (one flow)
#   tunnel             iperf3 -> vlink tunnel --stack identity+tcp ->
#                      vlink serve -> iperf3 server (the kernel's default)
#   tunnel-bbr         the same with identity+tcp:cc=bbr: the tunnel's
#                      socket sends with BBR, and its hello asks serve to
#                      use BBR on its side too
#   tunnel-bbr-down    tunnel-bbr with iperf3 -R: serve sends, so the
#                      download uses what the hello asked for
#
# (identity: a hello, so that serve learns the congestion control; it
# adds an end marker and no transformation.) Prints the median Mbit/s
# received over REPS runs (min..max), the ratio to one CUBIC flow, and the
# CPU seconds per GB of the iperf3 ends and of the vlink processes.
#
# Target of issue 40: on wan50, tunnel-bbr >= 850 Mbit/s.
#
# Needs root (network namespaces) and a kernel offering bbr. Environment:
# PROFILES (default "wan50 wan50-clean"), DURATION (iperf3 -t, default
# 15), REPS (default 3), VLINK and VLINK_LAB (binaries; default: built
# from this checkout).
PROFILES=${PROFILES:-"wan50 wan50-clean"}
DURATION=${DURATION:-15}
REPS=${REPS:-3}
. "$(dirname "$0")/lib.sh"
need_root "network namespaces"
need iperf3 python3
grep -qw bbr /proc/sys/net/ipv4/tcp_available_congestion_control || modprobe tcp_bbr 2>/dev/null || true
grep -qw bbr /proc/sys/net/ipv4/tcp_available_congestion_control || { echo "the kernel offers no bbr" >&2; exit 1; }
build_vlink
build_vlink_lab

results=$work/results.txt
: >"$results"

for profile in $PROFILES; do
  lab_up "$profile"
  serve=$(lab_start server "$VLINK" serve --listen "$server:7000" --target 127.0.0.1:5201 --log-level warn)
  lab_wait_port server 7000
  plain=$(lab_start client "$VLINK" tunnel --listen 127.0.0.1:8101 --to "$server:7000" --stack identity+tcp --log-level warn)
  bbr=$(lab_start client "$VLINK" tunnel --listen 127.0.0.1:8102 --to "$server:7000" --stack identity+tcp:cc=bbr --log-level warn)
  lab_wait_port client 8101
  lab_wait_port client 8102
  echo "== $profile: the lab's default congestion control: $(lab client cat /proc/sys/net/ipv4/tcp_congestion_control)" >&2
  paths=(cubic bbr tunnel tunnel-bbr tunnel-bbr-down)
  for rep in $(seq "$REPS"); do
    echo " round $rep" >&2
    for path in $(printf '%s\n' "${paths[@]}" | shuf); do
      case $path in
        cubic | bbr) lab_iperf "$results" "$profile" "$path" -- -t "$DURATION" -c "$server" -C "$path" ;;
        tunnel) lab_iperf "$results" "$profile" "$path" "$serve" "$plain" -- -t "$DURATION" -c 127.0.0.1 -p 8101 ;;
        tunnel-bbr) lab_iperf "$results" "$profile" "$path" "$serve" "$bbr" -- -t "$DURATION" -c 127.0.0.1 -p 8102 ;;
        tunnel-bbr-down) lab_iperf "$results" "$profile" "$path" "$serve" "$bbr" -- -t "$DURATION" -c 127.0.0.1 -p 8102 -R ;;
      esac
    done
  done
  kill "$serve" "$plain" "$bbr" 2>/dev/null || true
  lab_down
done

python3 - "$results" <<'PY'
import sys
import targets, wan_report
rows = wan_report.read(sys.argv[1])
wan_report.report(rows, base="cubic")
if "wan50" in rows and "tunnel-bbr" in rows["wan50"]:
    targets.check("wan50: tunnel with tcp:cc=bbr, Mbit/s", wan_report.median(rows["wan50"]["tunnel-bbr"]), ">=", 850)
PY
