#!/usr/bin/env bash
# Memory per idle connection: IDLE_CONNS (default 10000) connections
# through vlink tunnel --stack zstd -> vlink serve --target -> an echo
# server, each echoing a few bytes so every layer is set up, then idle for
# IDLE_SETTLE (default 5s). Reports the VmRSS growth per connection of the
# tunnel and of serve, and, measured in the same run, of a plain tunnel
# (--stack tcp) as the baseline. The work is BenchmarkIdleConns in
# integration/bench_test.go; this script raises the descriptor limit first.
set -euo pipefail
cd "$(dirname "$0")/../.."

conns=${IDLE_CONNS:-10000}
need=$((2 * conns + 128))
# Every process holds two descriptors per connection. Raising the hard
# limit needs root (CAP_SYS_RESOURCE); without it the benchmark opens as
# many connections as the limit allows and says so.
ulimit -n 200000 2>/dev/null || ulimit -n "$need" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
echo "# RLIMIT_NOFILE $(ulimit -n) (hard $(ulimit -Hn)); $(nproc) CPUs; Linux $(uname -r)"

# A missed target fails the benchmark: exit 3 for it, as the other
# scripts do (see lib.sh), 1 for anything else.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! IDLE_CONNS=$conns go test -run '^$' -bench '^BenchmarkIdleConns$' -benchtime 1x -timeout 20m -v ./integration/ 2>&1 | tee "$log"; then
  grep -q 'MISSED' "$log" && exit 3
  exit 1
fi
