#!/usr/bin/env bash
# A legitimate client's connect time through `vlink tunnel` -> `vlink serve
# --key-file` while 2,000 hostile connections hammer serve's port: each
# sends the hello's magic and goes silent, and reconnects the moment serve
# sheds it. Rounds with and without the attack alternate (ROUNDS of
# PROBES probes each), so both share the machine's state.
#
# The attacker runs on CPU 1, everything else (serve, the tunnel, the
# probing client, the echo target) on CPU 0, as if the attacker were
# another machine: on one core it would measure the attacker's CPU use.
# A probe connects to the tunnel and times one byte echoed back: the
# tunnel's dial, the VLink handshake with its key proof, the target dial.
#
# Target (issue 10, item 3; issue 38, item 13): p99 under attack <= 100 ms.
# Environment: HOSTILE (2000), ROUNDS (5), PROBES (20), VLINK (default:
# built here), and the attack's kind:
#   FROM    other: every hostile connection from 127.0.0.2 (default);
#           same: from 127.0.0.1, the probing client's own address (a
#           shared NAT); many: from 100 addresses, 127.0.1.1-100
#   ATTACK  magic: the hello's magic, then silence (default); hello: a
#           whole hello with a nonce but without the key, then silence
#   KEYED   1: serve and tunnel with --key-file (default); 0: without
HOSTILE=${HOSTILE:-2000}
ROUNDS=${ROUNDS:-5}
PROBES=${PROBES:-20}
FROM=${FROM:-other}
ATTACK=${ATTACK:-magic}
KEYED=${KEYED:-1}
. "$(dirname "$0")/lib.sh"
need socat python3 taskset
build_vlink
[ "$(nproc)" -ge 2 ] || { echo "$(basename "$0"): needs 2 CPUs (one for the attacker)" >&2; exit 1; }

for port in 25301 25302 25303; do
  port_free "$port" || { echo "$(basename "$0"): port $port is taken (a run left behind?)" >&2; exit 1; }
done
head -c 32 /dev/urandom | base64 >"$work/key"
chmod 600 "$work/key"
keyflag=(--key-file "$work/key")
[ "$KEYED" = 1 ] || keyflag=()
taskset -c 0 socat TCP-LISTEN:25301,bind=127.0.0.1,reuseaddr,fork EXEC:cat &
pids+=($!)
wait_listen 25301
taskset -c 0 "$VLINK" serve --listen 127.0.0.1:25302 --target 127.0.0.1:25301 "${keyflag[@]}" --log-level warn &
pids+=($!)
wait_listen 25302
taskset -c 0 "$VLINK" tunnel --listen 127.0.0.1:25303 --to 127.0.0.1:25302 --stack zstd "${keyflag[@]}" --log-level warn &
pids+=($!)
wait_listen 25303

cat >"$work/attack.py" <<'EOF'
# Keeps N connections to PORT open from the sources FROM names, each
# sending ATTACK's bytes and then nothing; a connection the server closes
# is replaced at once.
import os, selectors, socket, struct, sys
n, port, frm, attack = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
magic = b"\x89VLK\r\n\x1a\n"
sources = {"other": ["127.0.0.2"], "same": ["127.0.0.1"],
           "many": [f"127.0.1.{i}" for i in range(1, 101)]}[frm]
def first_flight():
    if attack == "magic":
        return magic
    # A hello (version 1, type 1) of the stack "zstd" (field 1) and a
    # random nonce (field 3, 32 bytes): a keyed dialer's, without its key.
    body = struct.pack(">BH", 1, 4) + b"zstd" + struct.pack(">BH", 3, 32) + os.urandom(32)
    return magic + struct.pack(">BBH", 1, 1, len(body)) + body
sel = selectors.DefaultSelector()
opened = 0
def open_one():
    global opened
    s = socket.socket()
    s.setblocking(False)
    s.bind((sources[opened % len(sources)], 0))
    s.connect_ex(("127.0.0.1", port))
    sel.register(s, selectors.EVENT_WRITE, "connecting")
    opened += 1
for _ in range(n):
    open_one()
while True:
    for key, _ in sel.select():
        s = key.fileobj
        if key.data == "connecting":
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                try:
                    s.send(first_flight())
                    sel.modify(s, selectors.EVENT_READ, "silent")
                    continue
                except OSError:
                    pass
        else:
            try:
                if s.recv(4096):
                    continue
            except OSError:
                pass
        sel.unregister(s)
        s.close()
        open_one()
EOF

cat >"$work/probe.py" <<'EOF'
# Times PROBES connections through the tunnel: connect, one byte out, the
# echo back. Prints "ms" per line, or "failed ms" for a probe that got no
# echo (the tunnel resets its client when it cannot get through).
import socket, sys, time
port, probes = int(sys.argv[1]), int(sys.argv[2])
for _ in range(probes):
    t = time.monotonic()
    ok = False
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(b"x")
            ok = s.recv(1) == b"x"
    except OSError:
        pass
    print(("" if ok else "failed ") + f"{(time.monotonic() - t) * 1000:.3f}", flush=True)
    time.sleep(0.05)
EOF

for r in $(seq "$ROUNDS"); do
  echo "== round $r/$ROUNDS: quiet, then $HOSTILE hostile connections" >&2
  taskset -c 0 python3 "$work/probe.py" 25303 "$PROBES" | sed 's/^/quiet /' >>"$work/times"
  taskset -c 1 python3 "$work/attack.py" "$HOSTILE" 25302 "$FROM" "$ATTACK" &
  attacker=$!
  pids+=("$attacker")
  sleep 2 # the attack builds up
  taskset -c 0 python3 "$work/probe.py" 25303 "$PROBES" | sed 's/^/attacked /' >>"$work/times"
  [ -n "${NSTAT:-}" ] && nstat -z TcpExtListenOverflows TcpExtListenDrops TcpExtTCPReqQFullDrop TcpExtTCPReqQFullDoCookies TcpExtSyncookiesSent >&2
  kill "$attacker"
  wait "$attacker" 2>/dev/null || true
  sleep 1
done

HOSTILE=$HOSTILE FROM=$FROM ATTACK=$ATTACK KEYED=$KEYED python3 - "$work/times" <<'EOF'
import os, sys
from targets import check
times = {"quiet": [], "attacked": []}
failed = {"quiet": 0, "attacked": 0}
for line in open(sys.argv[1]):
    k, *rest = line.split()
    if rest[0] == "failed":
        failed[k] += 1
    times[k].append(float(rest[-1]))
def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p / 100))]
print(f"connect + one echo through tunnel -> serve, ms; attack: {os.environ['HOSTILE']} from {os.environ['FROM']}, {os.environ['ATTACK']}, keyed={os.environ['KEYED']}")
print(f"  {'':9} {'n':>4} {'failed':>6} {'median':>8} {'p90':>8} {'p99':>8} {'max':>8}")
for k, v in times.items():
    print(f"  {k:9} {len(v):4d} {failed[k]:6d} {pct(v, 50):8.2f} {pct(v, 90):8.2f} {pct(v, 99):8.2f} {max(v):8.2f}")
check("probes failed under attack", failed["attacked"], "<=", 0)
print(f"  attacked / quiet, medians: {pct(times['attacked'], 50) / pct(times['quiet'], 50):.2f}")
check("connect p99 under attack (ms)", pct(times["attacked"], 99), "<=", 100)
EOF
