#!/usr/bin/env bash
# What an idle registered node costs a vlink relay: the relay's resident
# memory before and after N nodes registered (each with its own key, an
# encrypted control connection and its keepalives), per node, for each N
# in COUNTS. The nodes run in another process (relayidle). Checks the
# target of issue 11: at most 64 KiB per idle node at 10,000 nodes.
#
# Environment: COUNTS (default "1000 10000"), SETTLE (seconds to let the
# relay settle after registration, default 20: one keepalive round), VLINK
# (a vlink binary; default: built from this checkout), PORT (default 25600).
COUNTS=${COUNTS:-1000 10000}
SETTLE=${SETTLE:-20}
PORT=${PORT:-25600}
. "$(dirname "$0")/lib.sh"
need python3
build_vlink
# One descriptor per node in each process, and some.
ulimit -n "$(ulimit -Hn)"
for n in $COUNTS; do
  if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $((n + 200)) ]; then
    echo "the open files limit is $(ulimit -n), too low for $n nodes" >&2
    exit 1
  fi
done
port_free "$PORT" || { echo "port $PORT is in use: set PORT" >&2; exit 1; }
(cd "$root" && go build -o "$work/relayidle" ./integration/bench/relayidle)
"$VLINK" key --out "$work/network.key"
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs; $("$VLINK" version | head -1)"
echo "$env_line"
echo "## relay resident memory per idle node (VmRSS after - before) / N"
printf '%-8s %12s %12s %14s %12s\n' nodes "before KiB" "after KiB" "KiB per node" "register s"
results=()
for n in $COUNTS; do
  "$VLINK" relay --listen "127.0.0.1:$PORT" --key-file "$work/network.key" --max-nodes $((n + 10)) --log-level warn 2>"$work/relay-$n.log" &
  relay=$!
  pids+=($relay)
  wait_listen "$PORT"
  sleep 1
  before=$(rss_kib "$relay")
  "$work/relayidle" --relay "127.0.0.1:$PORT" --key-file "$work/network.key" --n "$n" >"$work/idle-$n.out" 2>"$work/idle-$n.err" &
  idle=$!
  pids+=($idle)
  for _ in $(seq 600); do grep -q '^registered' "$work/idle-$n.out" && break; sleep 0.5; done
  grep -q '^registered' "$work/idle-$n.out" || { echo "relayidle did not register $n nodes:" >&2; cat "$work/idle-$n.err" >&2; exit 1; }
  took=$(sed -n 's/^registered [0-9]* nodes in \(.*\)$/\1/p' "$work/idle-$n.out")
  sleep "$SETTLE"
  after=$(rss_kib "$relay")
  per=$(python3 -c "print(f'{($after - $before) / $n:.1f}')")
  printf '%-8s %12s %12s %14s %12s\n' "$n" "$before" "$after" "$per" "$took"
  results+=("$n:$per")
  kill "$idle" "$relay"
  wait "$idle" "$relay" 2>/dev/null || true
done
python3 - "${results[@]}" <<'PY'
import sys
import targets
for r in sys.argv[1:]:
    n, per = r.split(":")
    if n == "10000":
        targets.check("relay KiB per idle node at 10,000 nodes", float(per), "<=", 64)
PY
