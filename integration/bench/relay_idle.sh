#!/usr/bin/env bash
# What an idle registered node costs a vlink relay: the relay's resident
# memory before and after N nodes registered (each with its own key, an
# encrypted control connection and its keepalives), per node, for each N
# in COUNTS, in each mode of MODES: "key" (a network key, each node
# proving its derived key) and "member" (an owner, each node its own
# certificate and key). The nodes run in another process (relayidle).
# Checks the target of issue 11: at most 64 KiB per idle node at 10,000
# nodes, and issue 37's: a member costs at most 1.2x a key-mode node.
#
# Environment: COUNTS (default "1000 10000"), SETTLE (seconds to let the
# relay settle after registration, default 20: one keepalive round), VLINK
# (a vlink binary; default: built from this checkout), PORT (default 25600).
COUNTS=${COUNTS:-1000 10000}
MODES=${MODES:-key member}
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
"$VLINK" owner init --out "$work/owner.key" 2>/dev/null
"$VLINK" key --identity --out "$work/relay.key" 2>/dev/null
"$VLINK" cert sign --owner "$work/owner.key" --relay --name relay --pub "$("$VLINK" key --pub "$work/relay.key")" --out "$work/relay.crt" 2>/dev/null
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs; $("$VLINK" version | head -1)"
echo "$env_line"
echo "## relay resident memory per idle node (VmRSS after - before) / N"
printf '%-8s %-8s %12s %12s %14s %12s\n' mode nodes "before KiB" "after KiB" "KiB per node" "register s"
results=()
for n in $COUNTS; do
for mode in $MODES; do
  case $mode in
    key) relay_auth=(--key-file "$work/network.key"); idle_auth=(--key-file "$work/network.key") ;;
    member) relay_auth=(--cert "$work/relay.crt" --cert-key "$work/relay.key" --owner "$work/owner.key.pub"); idle_auth=(--owner-key "$work/owner.key") ;;
    *) echo "unknown mode $mode" >&2; exit 1 ;;
  esac
  "$VLINK" relay --listen "127.0.0.1:$PORT" "${relay_auth[@]}" --max-nodes $((n + 10)) --log-level warn 2>"$work/relay-$n.log" &
  relay=$!
  pids+=($relay)
  wait_listen "$PORT"
  sleep 1
  before=$(rss_kib "$relay")
  "$work/relayidle" --relay "127.0.0.1:$PORT" "${idle_auth[@]}" --n "$n" >"$work/idle-$n.out" 2>"$work/idle-$n.err" &
  idle=$!
  pids+=($idle)
  for _ in $(seq 600); do grep -q '^registered' "$work/idle-$n.out" && break; sleep 0.5; done
  grep -q '^registered' "$work/idle-$n.out" || { echo "relayidle did not register $n nodes:" >&2; cat "$work/idle-$n.err" >&2; exit 1; }
  took=$(sed -n 's/^registered [0-9]* nodes in \(.*\)$/\1/p' "$work/idle-$n.out")
  sleep "$SETTLE"
  after=$(rss_kib "$relay")
  per=$(python3 -c "print(f'{($after - $before) / $n:.1f}')")
  printf '%-8s %-8s %12s %12s %14s %12s\n' "$mode" "$n" "$before" "$after" "$per" "$took"
  results+=("$mode:$n:$per")
  kill "$idle" "$relay"
  wait "$idle" "$relay" 2>/dev/null || true
done
done
python3 - "${results[@]}" <<'PY'
import sys
import targets
per = {}
for r in sys.argv[1:]:
    mode, n, kib = r.split(":")
    per[mode, n] = float(kib)
    if n == "10000":
        targets.check(f"relay KiB per idle {mode} node at 10,000 nodes", float(kib), "<=", 64)
for (mode, n), kib in per.items():
    if mode == "member" and ("key", n) in per:
        targets.check(f"member / key-mode KiB per idle node at {n} nodes", kib / per["key", n], "<=", 1.2)
PY
