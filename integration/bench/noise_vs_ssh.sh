#!/usr/bin/env bash
# The encrypted plain stack against OpenSSH: iperf3 on loopback through
#
#   direct            iperf3 client -> iperf3 server
#   vlink-noise       client -> vlink tunnel --stack noise --key-file K
#                            -> vlink serve --key-file K --target server
#   openssh-default   client -> ssh -N -L (OpenSSH's default cipher) -> sshd -> server
#   openssh-aes128gcm the same with -c aes128-gcm@openssh.com
#
# in the same run, REPS rounds, the paths interleaved and rotated each
# round. Prints the median Gbit/s (min..max), and the CPU seconds per GB
# of both ends of each tunnel (vlink tunnel + vlink serve; ssh + the sshd
# processes of the session), and checks the targets of issue 10:
# vlink-noise >= 1.2x OpenSSH's default cipher and >= 0.8x aes128-gcm.
#
# Needs root (sshd), iperf3, openssh-server and -client, python3
# (integration/deps.sh installs them).
#
# Environment: DURATION (iperf3 -t, default 5), REPS (default 3), VLINK
# (a vlink binary; default: built from this checkout), PORT_BASE (default
# 25400; uses PORT_BASE+1..+7).
DURATION=${DURATION:-5}
REPS=${REPS:-3}
PORT_BASE=${PORT_BASE:-25400}
. "$(dirname "$0")/lib.sh"
need iperf3 python3 ssh ssh-keygen sshd
need_root sshd
build_vlink

need_ports 7
sshd_port=$(p 1) iperf_port=$(p 2) serve_port=$(p 3)

# sshd with generated keys, as ssh_socks.sh runs it.
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
LogLevel ERROR
CONF
/usr/sbin/sshd -D -e -f "$work/sshd_config" 2>"$work/sshd.log" &
pids+=($!) sshd_pid=$!
iperf3 -s -B 127.0.0.1 -p "$iperf_port" >"$work/iperf3.log" 2>&1 &
pids+=($!)
head -c 32 /dev/urandom | base64 >"$work/key"
chmod 600 "$work/key"
"$VLINK" serve --listen "127.0.0.1:$serve_port" --target "127.0.0.1:$iperf_port" --key-file "$work/key" --log-level warn 2>"$work/serve.log" &
pids+=($!) serve_pid=$!
for port in "$sshd_port" "$iperf_port" "$serve_port"; do wait_listen "$port"; done

user=$(id -un)
ssh_opts=(-F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -i "$work/user" -o "UserKnownHostsFile=$work/known_hosts"
  -o StrictHostKeyChecking=yes -o ExitOnForwardFailure=yes -p "$sshd_port" -l "$user")

# name -> local port; the processes whose CPU time counts: the client
# end, and the server end (a process tree: sshd forks per session).
declare -A port client server
"$VLINK" tunnel --listen "127.0.0.1:$(p 4)" --to "127.0.0.1:$serve_port" --stack noise --key-file "$work/key" --log-level warn &
pids+=($!)
port[vlink-noise]=$(p 4) client[vlink-noise]=$! server[vlink-noise]=$serve_pid
# The same with the cipher of before the negotiation (ChaCha20-Poly1305).
"$VLINK" tunnel --listen "127.0.0.1:$(p 7)" --to "127.0.0.1:$serve_port" --stack noise:aes=false --key-file "$work/key" --log-level warn &
pids+=($!)
port[vlink-noise-chacha]=$(p 7) client[vlink-noise-chacha]=$! server[vlink-noise-chacha]=$serve_pid
start_openssh() { # name port cipher-option...
  local name=$1 lport=$2
  shift 2
  ssh "${ssh_opts[@]}" "$@" -N -L "127.0.0.1:$lport:127.0.0.1:$iperf_port" 127.0.0.1 2>>"$work/ssh.log" &
  pids+=($!)
  port[$name]=$lport client[$name]=$! server[$name]=$sshd_pid
}
start_openssh openssh-default "$(p 5)"
start_openssh openssh-aes128gcm "$(p 6)" -c aes128-gcm@openssh.com
port[direct]=$iperf_port
for name in "${!port[@]}"; do wait_listen "${port[$name]}"; done

# tree_ticks PID: CPU ticks of PID and all its descendants (the sshd
# session processes of the tunnels), reaped children included.
tree_ticks() {
  local t kid
  t=$(cpu_ticks_all "$1")
  for kid in $(pgrep -P "$1" || true); do t=$((t + $(tree_ticks "$kid"))); done
  echo "$t"
}
ticks_of() { # path: CPU ticks of its client end and of its server end
  [ "$1" = direct ] && { echo 0 0; return; }
  echo "$(cpu_ticks_all "${client[$1]}") $(tree_ticks "${server[$1]}")"
}

default_cipher=$(ssh "${ssh_opts[@]}" -v 127.0.0.1 true 2>&1 | sed -n 's/.*kex: server->client cipher: \([^ ]*\).*/\1/p' | head -1)
env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs; $("$VLINK" version | head -1); $(ssh -V 2>&1); $(iperf3 --version | head -1)"
echo "$env_line" >&2
paths=(direct vlink-noise vlink-noise-chacha openssh-default openssh-aes128gcm)
for rep in $(seq "$REPS"); do
  n=${#paths[@]}
  for i in $(seq 0 $((n - 1))); do
    path=${paths[$(( (i + rep) % n ))]}
    # The other tunnels' sshd sessions are idle: counting them costs nothing.
    read -r c0 s0 < <(ticks_of "$path")
    iperf3 -c 127.0.0.1 -p "${port[$path]}" -t "$DURATION" --json >"$work/$path-$rep.json" || true
    read -r c1 s1 < <(ticks_of "$path")
    echo "$((c1 - c0)) $((s1 - s0))" >"$work/$path-$rep.cpu"
    echo "rep $rep $path: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%.2f Gbit/s" % (r["end"]["sum_received"]["bits_per_second"]/1e9) if "end" in r and "sum_received" in r["end"] else r.get("error"))' "$work/$path-$rep.json")" >&2
  done
done

echo "$env_line"
python3 - "$work" "$REPS" "$DURATION" "$default_cipher" "$(getconf CLK_TCK)" <<'PY'
import json, statistics, sys
import targets
work, reps, duration, ossh_default, hz = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
paths = ["direct", "vlink-noise", "vlink-noise-chacha", "openssh-default", "openssh-aes128gcm"]
med, rng, cpu, cpu_c, cpu_s, gbps = {}, {}, {}, {}, {}, {}
for p in paths:
    runs, per_gb, per_gb_c, per_gb_s = [], [], [], []
    for rep in range(1, reps + 1):
        r = json.load(open(f"{work}/{p}-{rep}.json"))
        if "error" in r:
            sys.exit(f"{p} run {rep}: iperf3 error: {r['error']}")
        s = r["end"]["sum_received"]
        runs.append(s["bits_per_second"] / 1e9)
        c, sv = (int(x) for x in open(f"{work}/{p}-{rep}.cpu").read().split())
        gb = s["bytes"] / 1e9
        per_gb.append((c + sv) / hz / gb)
        per_gb_c.append(c / hz / gb)
        per_gb_s.append(sv / hz / gb)
    gbps[p] = runs
    med[p], rng[p] = statistics.median(runs), (min(runs), max(runs))
    cpu[p], cpu_c[p], cpu_s[p] = statistics.median(per_gb), statistics.median(per_gb_c), statistics.median(per_gb_s)
def ratio(a, b):
    """median and spread of the per-round ratios a/b"""
    r = [x / y for x, y in zip(gbps[a], gbps[b])]
    return statistics.median(r), min(r), max(r)
print(f"## iperf3 -t {duration}, one stream, {reps} interleaved rounds, median (min..max); CPU = CPU seconds per GB: both tunnel ends, then the client end (vlink tunnel; ssh) and the server end (vlink serve; the sshd session)")
print(f"OpenSSH's default cipher here: {ossh_default}")
print(f"{'path':<19} {'Gbit/s':>7}  {'min..max':>13}  {'x direct':>8}  {'CPU s/GB':>8}  {'client':>6}  {'server':>6}")
for p in paths:
    c = "-" if p == "direct" else f"{cpu[p]:.2f}"
    cc = "-" if p == "direct" else f"{cpu_c[p]:.2f}"
    cs = "-" if p == "direct" else f"{cpu_s[p]:.2f}"
    print(f"{p:<19} {med[p]:7.2f}  {rng[p][0]:6.2f}..{rng[p][1]:6.2f}  {med[p] / med['direct']:8.2f}  {c:>8}  {cc:>6}  {cs:>6}")
for a, b in (("vlink-noise", "openssh-default"), ("vlink-noise", "openssh-aes128gcm"), ("vlink-noise-chacha", "openssh-aes128gcm"), ("vlink-noise", "vlink-noise-chacha")):
    m, lo, hi = ratio(a, b)
    print(f"{a} / {b} = {m:.2f} per round ({lo:.2f}..{hi:.2f}); CPU per GB {cpu[a] / cpu[b]:.2f}x")
targets.check("vlink-noise / OpenSSH default (issue 10)", ratio("vlink-noise", "openssh-default")[0], ">=", 1.2)
targets.check("vlink-noise / OpenSSH aes128gcm (issue 10)", ratio("vlink-noise", "openssh-aes128gcm")[0], ">=", 0.8)
targets.check("vlink-noise / OpenSSH aes128gcm (issue 40)", ratio("vlink-noise", "openssh-aes128gcm")[0], ">=", 2.5)
targets.check("vlink-noise CPU s/GB, both ends (issue 40)", cpu["vlink-noise"], "<=", 1.0)
PY
