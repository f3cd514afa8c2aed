# Shared by the bench scripts; source it first:
#
#   . "$(dirname "$0")/lib.sh"
#
# It sets root (the module root) and work (a temporary folder), and on exit
# stops every process group in pids, takes down the lab in lab_id, deletes
# the namespaces in made_ns and removes work. The helpers:
#
#   need PROGRAM...      exit unless each is installed (sbin included)
#   need_root WHY        exit unless run as root
#   build_vlink          set VLINK to a vlink built from the checkout, unless given
#   build_vlink_lab      the same for VLINK_LAB
#   port_free PORT       whether nothing listens on 127.0.0.1:PORT
#   need_ports N         exit unless PORT_BASE+1..+N are free; then p K is PORT_BASE+K
#   wait_listen PORT     wait until something listens on 127.0.0.1:PORT
#   cpu_ticks PID...     user+system clock ticks of the processes
#   cpu_ticks_all PID    the same, with the children it has reaped
#   descendants PID...   the PIDs and every process below them (sshd's
#                        sessions), for cpu_ticks
#   perf_record FILE PID SECONDS  start `perf record -g` of PID for SECONDS
#                        into FILE in the background; its pid is appended
#                        to perfs (wait for them with perf_wait)
#   lab_up PROFILE       bring the WAN lab up with PROFILE (lab_id is set;
#                        cleanup takes it down), its server's iperf3 -s
#                        on port 5201 started, and set server to its address
#   lab_down             take it down now
#   lab HOST CMD...      run CMD in a lab host (vlink-lab exec)
#   lab_start HOST CMD...  start CMD in the background there, print its pid
#   lab_wait_port HOST PORT  wait until something listens on PORT there
#   lab_iperf RESULTS PROFILE PATH [SERVE [TUNNEL...]] -- ARGS...  run
#                        iperf3 -J ARGS in the lab's client and append a
#                        row to RESULTS: profile, path, Mbit/s received,
#                        bytes, the iperf3 ends' CPU seconds, SERVE's and
#                        the TUNNELs' (read by wan_report.py)
#
# Targets are checked by targets.py (see there), which the scripts' Python
# reports import: a script that ran to the end but missed a target exits
# with status 3.

set -euo pipefail
set -m # background jobs in their own process groups, so cleanup reaches their children

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here=$root/integration/bench
export PATH=$PATH:/usr/sbin:/sbin
work=$(mktemp -d)
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH} VLINK_BENCH_MISSED=$work/missed
pids=()
made_ns=()
lab_id=

cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$lab_id" ]; then "$VLINK_LAB" down "$lab_id" >/dev/null 2>&1 || true; fi
  for ns in "${made_ns[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  if [ "$status" -eq 0 ] && [ -s "$work/missed" ]; then
    echo "$(basename "$0"): missed $(wc -l <"$work/missed") target(s): $(paste -sd, "$work/missed")" >&2
    status=3
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT

need() {
  local p
  for p in "$@"; do
    command -v "$p" >/dev/null || { echo "$(basename "$0"): needs $p (integration/deps.sh installs it)" >&2; exit 1; }
  done
}

need_root() {
  [ "$(id -u)" -eq 0 ] || { echo "$(basename "$0"): needs root ($1)" >&2; exit 1; }
}

build_vlink() {
  if [ -z "${VLINK:-}" ]; then
    (cd "$root" && go build -o "$work/vlink" ./cmd/vlink)
    VLINK=$work/vlink
  fi
}

build_vlink_lab() {
  if [ -z "${VLINK_LAB:-}" ]; then
    (cd "$root" && go build -o "$work/vlink-lab" ./cmd/vlink-lab)
    VLINK_LAB=$work/vlink-lab
  fi
}

port_free() {
  ! grep -q " $(printf '0100007F:%04X' "$1") 00000000:0000 0A " /proc/net/tcp
}

p() { echo $((PORT_BASE + $1)); }

need_ports() {
  local i
  for i in $(seq 1 "$1"); do
    if ! port_free "$(p "$i")"; then
      echo "port $(p "$i") is in use: set PORT_BASE to a free range" >&2
      exit 1
    fi
  done
}

wait_listen() {
  local _
  for _ in $(seq 400); do
    port_free "$1" || return 0
    sleep 0.05
  done
  echo "nothing listens on port $1" >&2
  exit 1
}

cpu_ticks() {
  local t=0 pid
  for pid in "$@"; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$pid/stat"))); done
  echo "$t"
}

descendants() {
  local pid
  for pid in "$@"; do
    echo "$pid"
    # shellcheck disable=SC2046
    [ -z "$(pgrep -P "$pid")" ] || descendants $(pgrep -P "$pid")
  done
}

cpu_ticks_all() {
  awk '{ print $14 + $15 + $16 + $17 }' "/proc/$1/stat"
}

perfs=()
perf_record() {
  mkdir -p "$(dirname "$1")"
  perf record -q -g -p "$2" -o "$1" -- sleep "$3" 2>/dev/null &
  perfs+=($!)
}

perf_wait() {
  [ ${#perfs[@]} -eq 0 ] || wait "${perfs[@]}" || true
  perfs=()
}

lab() { "$VLINK_LAB" exec "$@"; }

lab_up() {
  local out
  out=$("$VLINK_LAB" up --detach "$1")
  lab_id=$(sed -n 's/.*vlink-lab down \([0-9-]*\).*/\1/p' <<<"$out" | head -1)
  server=10.77.0.2
  lab server iperf3 -s -D -p 5201 -I "$work/iperf3.pid"
}

# lab_up_web PROFILE brings up a lab for short fetches to a keyed gateway:
# lab() then names it (lib.sh's names none, which fails while another lab,
# a go test's, is up), $work/www/small is a 1 KiB file to serve (its
# SHA-256 in want), $work/key a pre-shared key and $work/identity a
# gateway's identity.
lab_up_web() {
  local out
  out=$("$VLINK_LAB" up --detach "$1")
  lab_id=$(sed -n 's/.*vlink-lab down \([0-9-]*\).*/\1/p' <<<"$out" | head -1)
  server=10.77.0.2
  lab() { "$VLINK_LAB" exec --lab "$lab_id" "$@"; }
  mkdir -p "$work/www"
  head -c 1024 /dev/urandom >"$work/www/small"
  want=$(sha256sum <"$work/www/small" | cut -d' ' -f1)
  head -c 32 /dev/urandom | base64 >"$work/key"
  chmod 600 "$work/key"
  "$VLINK" key --identity --out "$work/identity" 2>/dev/null
}

lab_down() {
  # By its pid: a lab host shares the machine's processes, and pkill would
  # reach every iperf3 there.
  lab server kill "$(cat "$work/iperf3.pid")" || true
  "$VLINK_LAB" down "$lab_id" >/dev/null
  lab_id=
}

lab_start() {
  local host=$1
  shift
  lab "$host" sh -c 'exec "$@" >/dev/null 2>&1 </dev/null & echo $!' sh "$@"
}

lab_wait_port() {
  local _
  for _ in $(seq 200); do
    lab "$1" sh -c "grep -q ':$(printf '%04X' "$2") 00000000:0000 0A' /proc/net/tcp" && return 0
    sleep 0.05
  done
  echo "nothing listens on port $2 in $1" >&2
  exit 1
}

lab_iperf() {
  local results=$1 profile=$2 path=$3 procs=() s0=0 s1=0 t0=0 t1=0
  shift 3
  while [ "$1" != -- ]; do procs+=("$1"); shift; done
  shift
  if [ ${#procs[@]} -gt 0 ]; then s0=$(cpu_ticks "${procs[0]}"); t0=$(cpu_ticks "${procs[@]:1}"); fi
  lab client iperf3 -J "$@" >"$work/run.json" || true
  if [ ${#procs[@]} -gt 0 ]; then s1=$(cpu_ticks "${procs[0]}"); t1=$(cpu_ticks "${procs[@]:1}"); fi
  python3 - "$profile" "$path" $((s1 - s0)) $((t1 - t0)) "$(getconf CLK_TCK)" "$work/run.json" >>"$results" <<'PY' || echo "$profile $path: iperf3 failed" >&2
import json, sys
profile, path, serve, tunnel, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
r = json.load(open(sys.argv[6]))
end = r["end"]
recv = end["sum_received"]
cpu = end["cpu_utilization_percent"]
iperf_cpu = (cpu["host_total"] + cpu["remote_total"]) / 100 * recv["seconds"]
print(profile, path, recv["bits_per_second"] / 1e6, recv["bytes"], iperf_cpu, serve / hz, tunnel / hz)
PY
  printf '  %-12s %s\n' "$path" "$(tail -1 "$results" | awk '{printf "%.1f Mbit/s", $3}')" >&2
}
