#!/usr/bin/env bash
# The ssh and socks5 factories against their baselines, on loopback, in
# one run, interleaved so that a noisy machine affects all alike:
#
# 1. Throughput (iperf3, one stream): vlink tunnel --stack ssh:... against
#    OpenSSH's ssh -N -L to the same sshd, each with the same cipher
#    (aes128-gcm@openssh.com, then chacha20-poly1305@openssh.com), and
#    each with its default choice; direct iperf3 for reference.
# 2. Time to open a connection (connect, one byte echoed back) through a
#    vlink tunnel over one shared SSH connection, connections 2..CONNS,
#    against a fresh ssh -N -L for each connection (start ssh, wait for
#    its port, connect, echo) and against vlink with share=false.
# 3. SOCKS5 through dante: iperf3 through vlink tunnel --stack
#    socks5:addr=dante against iperf3 direct and through a plain
#    vlink tunnel (--stack tcp, the relay alone); and connection setup
#    through dante against a direct connect.
#
# Targets: vlink >= 0.8x OpenSSH's Gbit/s with each cipher; the client
# end's CPU per GB at most 1.5x OpenSSH's with AES-GCM and each side's
# default, 2x with ChaCha20-Poly1305; through SOCKS5 at most 1.2x the
# plain relay's.
#
# Environment: DURATION (iperf3 -t, default 5), REPS (default 3), CONNS
# (default 100), VLINK (a vlink binary; default: built from this checkout),
# PORT_BASE (default 31400; uses PORT_BASE+1..+16, which must be free),
# PERF (a folder: record `perf record -g` of each path's client process,
# vlink tunnel or ssh -L, during its first round into PERF/PATH.data).
# Needs root (sshd).

DURATION=${DURATION:-5}
REPS=${REPS:-3}
CONNS=${CONNS:-100}
PORT_BASE=${PORT_BASE:-31400}
. "$(dirname "$0")/lib.sh"
need iperf3 socat python3 ssh ssh-keygen sshd danted
need_root sshd
[ -z "${PERF:-}" ] || need perf
build_vlink

need_ports 16
sshd_port=$(p 1) iperf_port=$(p 2) echo_port=$(p 3) dante_port=$(p 4)

# sshd with generated keys, as the tests run it.
mkdir -p /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$work/host"
ssh-keygen -q -t ed25519 -N '' -f "$work/user"
cp "$work/user.pub" "$work/authorized_keys"
printf '[127.0.0.1]:%s %s\n' "$sshd_port" "$(cut -d' ' -f1,2 "$work/host.pub")" >"$work/known_hosts"
cat >"$work/sshd_config" <<CONF
Port $sshd_port
ListenAddress 127.0.0.1
HostKey $work/host
PidFile none
AuthorizedKeysFile $work/authorized_keys
StrictModes no
UsePAM no
PermitRootLogin yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowTcpForwarding yes
MaxStartups 200
MaxSessions 200
LogLevel ERROR
CONF
/usr/sbin/sshd -D -e -f "$work/sshd_config" 2>"$work/sshd.log" &
pids+=($!)
cat >"$work/danted.conf" <<CONF
logoutput: $work/danted.log
internal: 127.0.0.1 port = $dante_port
external: 127.0.0.1
socksmethod: none
clientmethod: none
user.privileged: root
user.unprivileged: nobody
client pass {
  from: 127.0.0.0/8 to: 0.0.0.0/0
}
socks pass {
  from: 127.0.0.0/8 to: 127.0.0.0/8
  command: connect
}
CONF
/usr/sbin/danted -f "$work/danted.conf" -N 2 -p "$work/danted.pid" &
pids+=($!)
iperf3 -s -B 127.0.0.1 -p "$iperf_port" >"$work/iperf3.log" 2>&1 &
pids+=($!)
socat "TCP-LISTEN:$echo_port,bind=127.0.0.1,fork,reuseaddr" EXEC:cat 2>/dev/null &
pids+=($!)
for port in "$sshd_port" "$iperf_port" "$echo_port" "$dante_port"; do wait_listen "$port"; done

user=$(id -un)
ssh_opts=(-F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -i "$work/user" -o "UserKnownHostsFile=$work/known_hosts"
  -o StrictHostKeyChecking=yes -o ExitOnForwardFailure=yes -p "$sshd_port" -l "$user")
vssh="ssh:host=127.0.0.1,port=$sshd_port,user=$user,identity=$work/user,known-hosts=$work/known_hosts,agent=false,config=none"

# Throughput paths: name -> local port, and the client process whose CPU
# time per GB is reported (the machine is shared: CPU per byte is the
# figure that noise disturbs least).
declare -A port client
start_vlink() { # name port to stack
  "$VLINK" tunnel --listen "127.0.0.1:$2" --to "$3" --stack "$4" --log-level warn &
  pids+=($!)
  port[$1]=$2
  client[$1]=$!
}
start_openssh() { # name port cipher-option...
  local name=$1 lport=$2
  shift 2
  ssh "${ssh_opts[@]}" "$@" -N -L "127.0.0.1:$lport:127.0.0.1:$iperf_port" 127.0.0.1 2>>"$work/ssh.log" &
  pids+=($!)
  port[$name]=$lport
  client[$name]=$!
}
start_vlink vlink-aes128gcm "$(p 5)" "127.0.0.1:$iperf_port" "$vssh,cipher=aes128-gcm@openssh.com"
start_vlink vlink-chacha20 "$(p 6)" "127.0.0.1:$iperf_port" "$vssh,cipher=chacha20-poly1305@openssh.com"
start_vlink vlink-default "$(p 7)" "127.0.0.1:$iperf_port" "$vssh"
start_openssh openssh-aes128gcm "$(p 8)" -c aes128-gcm@openssh.com
start_openssh openssh-chacha20 "$(p 9)" -c chacha20-poly1305@openssh.com
start_openssh openssh-default "$(p 10)"
start_vlink socks5-dante "$(p 11)" "127.0.0.1:$iperf_port" "socks5:addr=127.0.0.1:$dante_port"
start_vlink relay-tcp "$(p 12)" "127.0.0.1:$iperf_port" "tcp"
port[direct]=$iperf_port
# Connection setup paths, to the echo server.
start_vlink setup-shared "$(p 13)" "127.0.0.1:$echo_port" "$vssh"
start_vlink setup-unshared "$(p 14)" "127.0.0.1:$echo_port" "$vssh,share=false"
start_vlink setup-socks5 "$(p 15)" "127.0.0.1:$echo_port" "socks5:addr=127.0.0.1:$dante_port"
for name in "${!port[@]}"; do wait_listen "${port[$name]}"; done

# Which cipher each side negotiated by default: OpenSSH's ssh -v says;
# x/crypto/ssh's order is its documented preference.
default_cipher=$(ssh "${ssh_opts[@]}" -v 127.0.0.1 true 2>&1 | sed -n 's/.*kex: server->client cipher: \([^ ]*\).*/\1/p' | head -1)
cat >"$work/ciphers.go" <<'GO'
package main

import (
	"fmt"

	"golang.org/x/crypto/ssh"
)

// The client offers its list in this order; the server takes the first
// one it supports.
func main() { fmt.Print(ssh.SupportedAlgorithms().Ciphers[0]) }
GO
go_default=$(cd "$root" && go run "$work/ciphers.go")

env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs; $("$VLINK" version | head -1); $(ssh -V 2>&1); $(iperf3 --version | head -1); dante $(/usr/sbin/danted -v 2>&1 | sed -n 's/Dante v\([0-9.]*\).*/\1/p')"
echo "$env_line" >&2
paths=(direct relay-tcp openssh-aes128gcm vlink-aes128gcm openssh-chacha20 vlink-chacha20 openssh-default vlink-default socks5-dante)
for rep in $(seq "$REPS"); do
  n=${#paths[@]}
  for i in $(seq 0 $((n - 1))); do
    path=${paths[$(( (i + rep) % n ))]}
    before=0
    [ -n "${client[$path]:-}" ] && before=$(cpu_ticks "${client[$path]}")
    if [ -n "${PERF:-}" ] && [ "$rep" = 1 ] && [ -n "${client[$path]:-}" ]; then
      perf_record "$PERF/$path.data" "${client[$path]}" "$DURATION"
    fi
    iperf3 -c 127.0.0.1 -p "${port[$path]}" -t "$DURATION" --json >"$work/$path-$rep.json" || true
    perf_wait
    ticks=0
    [ -n "${client[$path]:-}" ] && ticks=$(( $(cpu_ticks "${client[$path]}") - before ))
    echo "$ticks" >"$work/$path-$rep.cpu"
    echo "rep $rep $path: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%.2f Gbit/s" % (r["end"]["sum_received"]["bits_per_second"]/1e9) if "end" in r and "sum_received" in r["end"] else r.get("error"))' "$work/$path-$rep.json")" >&2
  done
done

echo "$env_line"
python3 - "$work" "$REPS" "$DURATION" "$default_cipher" "$go_default" "$(getconf CLK_TCK)" <<'PY'
import json, statistics, sys
import targets
work, reps, duration, ossh_default, go_default, hz = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
paths = ["direct", "relay-tcp", "openssh-aes128gcm", "vlink-aes128gcm", "openssh-chacha20", "vlink-chacha20",
         "openssh-default", "vlink-default", "socks5-dante"]
med, rng, cpu = {}, {}, {}
for p in paths:
    runs, per_gb = [], []
    for rep in range(1, reps + 1):
        r = json.load(open(f"{work}/{p}-{rep}.json"))
        if "error" in r:
            sys.exit(f"{p} run {rep}: iperf3 error: {r['error']}")
        s = r["end"]["sum_received"]
        runs.append(s["bits_per_second"] / 1e9)
        per_gb.append(int(open(f"{work}/{p}-{rep}.cpu").read()) / hz / (s["bytes"] / 1e9))
    med[p], rng[p] = statistics.median(runs), (min(runs), max(runs))
    cpu[p] = statistics.median(per_gb)
print(f"## throughput: iperf3 -t {duration}, one stream, {reps} runs each, median (min..max); client CPU = CPU seconds of the tunnel process (vlink tunnel or ssh -L) per GB")
print(f"OpenSSH's default cipher here: {ossh_default}; x/crypto/ssh's first choice: {go_default}")
print(f"{'path':<20} {'Gbit/s':>7}  {'min..max':>13}  {'x direct':>8}  {'client CPU s/GB':>15}")
for p in paths:
    c = "-" if p == "direct" else f"{cpu[p]:.3f}"
    print(f"{p:<20} {med[p]:7.2f}  {rng[p][0]:6.2f}..{rng[p][1]:6.2f}  {med[p] / med['direct']:8.2f}  {c:>15}")
for c in ("aes128gcm", "chacha20", "default"):
    print(f"vlink / OpenSSH ({c}) = {med['vlink-' + c] / med['openssh-' + c]:.2f}; CPU per GB vlink / OpenSSH = {cpu['vlink-' + c] / cpu['openssh-' + c]:.2f}")
    targets.check(f"vlink / OpenSSH, {c}", med['vlink-' + c] / med['openssh-' + c], ">=", 0.8)
# CPU per GB of the client end: x/crypto/ssh copies each byte twice on its
# way to a packet (1.5x OpenSSH's with AES-GCM, the default), and its
# ChaCha20 is generic code where OpenSSL's is vectorized (2x).
for c, limit in (("aes128gcm", 1.5), ("default", 1.5), ("chacha20", 2.0)):
    targets.check(f"vlink / OpenSSH, {c}, client CPU s/GB", cpu['vlink-' + c] / cpu['openssh-' + c], "<=", limit)
print(f"socks5 via dante / direct = {med['socks5-dante'] / med['direct']:.2f}; / plain vlink relay = {med['socks5-dante'] / med['relay-tcp']:.2f}")
# Through a SOCKS5 proxy the tunnel relays as it does plain: the proxy's
# handshake costs once per connection, not per byte.
targets.check("socks5 via dante / plain vlink relay, tunnel CPU s/GB", cpu['socks5-dante'] / cpu['relay-tcp'], "<=", 1.2)
PY

# Connection setup: connect, send one byte, read it back.
python3 - "$CONNS" "$(p 13)" "$(p 14)" "$(p 15)" "$echo_port" "$work" "${ssh_opts[*]}" "$(p 16)" <<'PY'
import socket, statistics, subprocess, sys, time
conns, shared, unshared, socks5, echo, work, ssh_opts, lport = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7].split(), int(sys.argv[8])

def echo_once(port, timeout=10):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"x")
    if s.recv(1) != b"x":
        raise SystemExit(f"no echo through port {port}")
    s.close()

def timed(f, *a):
    t = time.perf_counter()
    f(*a)
    return (time.perf_counter() - t) * 1e3

def fresh_ssh_L():
    # Start ssh -L, wait for its port, then echo through it: what a user
    # pays for a new ssh -L each time.
    p = subprocess.Popen(["ssh"] + ssh_opts + ["-N", "-L", f"127.0.0.1:{lport}:127.0.0.1:{echo}", "127.0.0.1"],
                         stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                echo_once(lport, timeout=2)
                return
            except (ConnectionRefusedError, ConnectionResetError):
                if p.poll() is not None:
                    raise SystemExit("ssh -L exited")
                time.sleep(0.001)
    finally:
        p.terminate()
        p.wait()

rows = {}
rows["direct connect"] = [timed(echo_once, echo) for _ in range(conns)]
first = timed(echo_once, shared)  # makes the shared SSH connection
rows["vlink ssh, shared (2nd..)"] = [timed(echo_once, shared) for _ in range(conns - 1)]
rows["vlink ssh, share=false"] = [timed(echo_once, unshared) for _ in range(conns)]
rows["fresh ssh -L each"] = [timed(fresh_ssh_L) for _ in range(conns)]
rows["vlink socks5 (dante)"] = [timed(echo_once, socks5) for _ in range(conns)]
print(f"## connection setup: connect + 1-byte echo, {conns} connections each, ms: median (min..max)")
print(f"vlink ssh, shared, 1st connection (SSH handshake included): {first:.1f}")
for k, v in rows.items():
    print(f"{k:<28} {statistics.median(v):8.2f}  ({min(v):.2f}..{max(v):.2f})")
print(f"fresh ssh -L / vlink shared = {statistics.median(rows['fresh ssh -L each']) / statistics.median(rows['vlink ssh, shared (2nd..)']):.0f}x")
print(f"socks5 via dante - direct = {statistics.median(rows['vlink socks5 (dante)']) - statistics.median(rows['direct connect']):.2f} ms")
PY
