#!/usr/bin/env bash
# Compression over a slow link: vlink's zstd and adaptive layers against an
# OpenSSH tunnel with and without -C, and against the plain path, carrying
# the same bytes over the same shaped link, in the same run.
#
#   client namespace                         server namespace
#   pusher -> [ssh -L | vlink tunnel] ==link==> [sshd | vlink serve] -> sink
#
# The link is a veth pair between two network namespaces made for the run,
# each end shaped by tc's tbf to RATE; everything else stays on each
# namespace's own loopback, unshaped. Paths, each pushing SIZE bytes of
# text (generated log lines and JSON) or of random bytes to a sink that
# checks their count and SHA-256:
#
#   direct   pusher -> sink across the link, plain TCP
#   plain    vlink tunnel --stack tcp (the plain stack) -> sink
#   ssh      ssh -N -L (OpenSSH; encrypts, does not compress) -> sshd -> sink
#   ssh-C    the same with -C (zlib, level 6, one stream)
#   identity vlink tunnel --stack identity -> vlink serve -> sink (the
#            framing of a layer that changes nothing: what carrying costs)
#   zstd     vlink tunnel --stack zstd -> vlink serve -> sink
#   adaptive     vlink tunnel --stack adaptive -> vlink serve -> sink
#
# Prints the median MB/s (application bytes) of REPS runs per path, paths
# interleaved and rotated each repetition, the ratios to the plain path
# and to ssh -C, and the CPU seconds per GB of each end's tunnel process
# (the client's ssh or vlink tunnel; the server's sshd sessions or vlink
# serve: what moved during the push), median of the runs.
#
# Needs root (namespaces, tc), iproute2, openssh-server and -client,
# python3 (integration/deps.sh installs them).
#
# Environment: RATE (tc syntax, default 100mbit), SIZE (bytes, default
# 64M), REPS (default 3), KINDS (default "text random"), VLINK (a vlink
# binary; default: built from this checkout). To run over another link,
# for instance the WAN lab's, give its namespaces and the server's address
# instead: NETNS_CLIENT, NETNS_SERVER, SERVER_ADDR (nothing is shaped
# then).
RATE=${RATE:-100mbit}
SIZE=${SIZE:-64M}
REPS=${REPS:-3}
KINDS=${KINDS:-"text random"}
. "$(dirname "$0")/lib.sh"
need_root "network namespaces, tc"
need ip tc ssh ssh-keygen sshd python3

size=$(python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$SIZE")
build_vlink

if [ -n "${NETNS_CLIENT:-}" ]; then
  cns=$NETNS_CLIENT sns=${NETNS_SERVER:?NETNS_SERVER too} srv=${SERVER_ADDR:?SERVER_ADDR too}
  link_desc="namespaces $cns -> $sns ($srv), as given"
else
  cns=vlc-c-$$ sns=vlc-s-$$ srv=10.78.0.2
  ip netns add "$cns"; made_ns+=("$cns")
  ip netns add "$sns"; made_ns+=("$sns")
  ip link add "vlc$$c" netns "$cns" type veth peer name "vlc$$s" netns "$sns"
  ip -n "$cns" addr add 10.78.0.1/24 dev "vlc$$c"
  ip -n "$sns" addr add "$srv/24" dev "vlc$$s"
  for ns in "$cns" "$sns"; do
    ip -n "$ns" link set lo up
    dev=vlc$$${ns:4:1}
    ip -n "$ns" link set "$dev" up
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$RATE" burst 32kb latency 50ms
  done
  link_desc="veth between two namespaces, tbf rate $RATE burst 32kb latency 50ms on each end"
fi
inc() { ip netns exec "$cns" "$@"; }
ins() { ip netns exec "$sns" "$@"; }

# wait_listen_ns NS PORT: until a TCP socket listens on PORT in NS.
wait_listen_ns() {
  local hex
  hex=$(printf ':%04X' "$2")
  for _ in $(seq 300); do
    ip netns exec "$1" awk -v p="$hex" '$4 == "0A" && $2 ~ p"$" { found=1 } END { exit !found }' /proc/net/tcp && return 0
    sleep 0.05
  done
  echo "nothing listens on port $2 in $1" >&2
  exit 1
}

sink=9000 sshp=9022 serve=9100
ports_ssh=9201 ports_sshc=9202 ports_zstd=9203 ports_auto=9204 ports_plain=9205 ports_ident=9206

ins python3 "$here/sinkpush.py" sink 0.0.0.0 "$sink" &
pids+=($!)

# sshd: a host key and a client key of our own, key authentication only.
mkdir -p /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$work/id"
cp "$work/id.pub" "$work/authorized_keys"
echo "[$srv]:$sshp $(cat "$work/host_key.pub")" >"$work/known_hosts"
cat >"$work/sshd_config" <<CONF
ListenAddress $srv:$sshp
HostKey $work/host_key
AuthorizedKeysFile $work/authorized_keys
PidFile $work/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding yes
Compression yes
CONF
ip netns exec "$sns" /usr/sbin/sshd -D -e -f "$work/sshd_config" 2>"$work/sshd.log" &
pids+=($!) sshd_pid=$!
ip netns exec "$sns" "$VLINK" serve --listen "$srv:$serve" --target "127.0.0.1:$sink" --log-level warn 2>"$work/serve.log" &
pids+=($!) serve_pid=$!
wait_listen_ns "$sns" "$sink"; wait_listen_ns "$sns" "$sshp"; wait_listen_ns "$sns" "$serve"

ssh_opts=(-N -o BatchMode=yes -o StrictHostKeyChecking=yes -o "UserKnownHostsFile=$work/known_hosts"
  -o ExitOnForwardFailure=yes -i "$work/id" -p "$sshp")
# ip netns exec runs the program in its own place: $! is the program's
# (not through inc, whose subshell would be $!).
declare -A client server
ip netns exec "$cns" ssh "${ssh_opts[@]}" -L "127.0.0.1:$ports_ssh:127.0.0.1:$sink" "root@$srv" 2>"$work/ssh.log" &
pids+=($!) client[ssh]=$! server[ssh]=$sshd_pid
ip netns exec "$cns" ssh "${ssh_opts[@]}" -C -L "127.0.0.1:$ports_sshc:127.0.0.1:$sink" "root@$srv" 2>"$work/sshc.log" &
pids+=($!) client[ssh-C]=$! server[ssh-C]=$sshd_pid
ip netns exec "$cns" "$VLINK" tunnel --listen "127.0.0.1:$ports_zstd" --to "$srv:$serve" --stack zstd --log-level warn &
pids+=($!) client[zstd]=$! server[zstd]=$serve_pid
ip netns exec "$cns" "$VLINK" tunnel --listen "127.0.0.1:$ports_auto" --to "$srv:$serve" --stack adaptive --log-level warn &
pids+=($!) client[adaptive]=$! server[adaptive]=$serve_pid
ip netns exec "$cns" "$VLINK" tunnel --listen "127.0.0.1:$ports_plain" --to "$srv:$sink" --stack tcp --log-level warn &
pids+=($!) client[plain]=$!
ip netns exec "$cns" "$VLINK" tunnel --listen "127.0.0.1:$ports_ident" --to "$srv:$serve" --stack identity --log-level warn &
pids+=($!) client[identity]=$! server[identity]=$serve_pid
for p in $ports_ssh $ports_sshc $ports_zstd $ports_auto $ports_plain $ports_ident; do wait_listen_ns "$cns" "$p"; done

declare -A port=([direct]="$srv $sink" [plain]="127.0.0.1 $ports_plain" [ssh]="127.0.0.1 $ports_ssh"
  [ssh-C]="127.0.0.1 $ports_sshc" [zstd]="127.0.0.1 $ports_zstd" [adaptive]="127.0.0.1 $ports_auto"
  [identity]="127.0.0.1 $ports_ident")
paths=(direct plain ssh ssh-C identity zstd adaptive)

env_line="# $(date -u +%FT%TZ) Linux $(uname -r), $(nproc) CPUs; $("$VLINK" version); $(ssh -V 2>&1); link: $link_desc; $size bytes per push"
echo "$env_line" >&2
for kind in $KINDS; do
  python3 "$here/sinkpush.py" gen "$kind" "$size" "$work/$kind.dat"
  inc python3 "$here/sinkpush.py" push ${port[direct]} "$work/$kind.dat" >/dev/null # warm up
  for rep in $(seq "$REPS"); do
    for i in "${!paths[@]}"; do
      path=${paths[$(( (i + rep) % ${#paths[@]} ))]}
      # The server's side: sshd's sessions (one per ssh; the other idles
      # through the push) or serve.
      c0=$(cpu_ticks ${client[$path]:-}) s0=$(cpu_ticks $(descendants ${server[$path]:-}))
      secs=$(inc python3 "$here/sinkpush.py" push ${port[$path]} "$work/$kind.dat")
      c1=$(cpu_ticks ${client[$path]:-}) s1=$(cpu_ticks $(descendants ${server[$path]:-}))
      echo "$secs" >"$work/$kind-$path-$rep.s"
      echo "$((c1 - c0)) $((s1 - s0))" >"$work/$kind-$path-$rep.cpu"
      echo "$kind rep $rep $path: $(python3 -c "print('%.1f MB/s' % ($size/1e6/$secs))")" >&2
    done
  done
done

echo "$env_line"
python3 - "$work" "$REPS" "$size" "$KINDS" "$(getconf CLK_TCK)" "${paths[@]}" <<'PY'
import statistics, sys
import targets
work, reps, size, kinds, hz, paths = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), int(sys.argv[5]), sys.argv[6:]
print(f"median of {reps} runs, MB/s of application bytes (min..max); x plain = / plain stack; x ssh-C = / ssh -C;")
print("CPU s/GB of application bytes, median: the client's tunnel (ssh, vlink tunnel) and the server's (sshd's sessions, vlink serve)")
for kind in kinds:
    med, rng, cpu = {}, {}, {}
    for p in paths:
        runs = [size / 1e6 / float(open(f"{work}/{kind}-{p}-{r}.s").read()) for r in range(1, reps + 1)]
        med[p], rng[p] = statistics.median(runs), (min(runs), max(runs))
        ticks = [[int(x) for x in open(f"{work}/{kind}-{p}-{r}.cpu").read().split()] for r in range(1, reps + 1)]
        cpu[p] = [statistics.median(t[i] / hz / (size / 1e9) for t in ticks) for i in (0, 1)]
    print(f"{kind}:")
    print(f"  {'path':<8} {'MB/s':>7} {'min..max':>15} {'x plain':>8} {'x ssh-C':>8} {'CPU client':>10} {'server':>7}")
    cell = lambda p, i: "-" if p == "direct" or p == "plain" and i == 1 else f"{cpu[p][i]:.2f}"
    for p in paths:
        print(f"  {p:<8} {med[p]:7.1f} {rng[p][0]:7.1f}..{rng[p][1]:6.1f} {med[p] / med['plain']:8.2f} {med[p] / med['ssh-C']:8.2f} {cell(p, 0):>10} {cell(p, 1):>7}")
    both = lambda p: cpu[p][0] + cpu[p][1]
    if kind == "text":
        targets.check("zstd / plain, text", med['zstd'] / med['plain'], ">=", 3)
        # What it costs for that: zstd's two ends, against ssh -C's (zlib).
        targets.check("zstd CPU s/GB (both ends) / ssh -C's, text", both('zstd') / both('ssh-C'), "<=", 1)
        print(f"  adaptive / plain, text: {med['adaptive'] / med['plain']:.2f}x")
    if kind == "random":
        targets.check("adaptive / plain, random (within 5%)", med['adaptive'] / med['plain'], ">=", 0.95)
        # Nothing to gain: adaptive should cost what carrying the bytes
        # through a layer does (issue 40, point 3: 1.15x identity's).
        targets.check("adaptive CPU s/GB (both ends) / identity's, random", both('adaptive') / both('identity'), "<=", 1.15)
PY
