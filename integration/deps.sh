#!/usr/bin/env bash
# Installs the Debian packages the integration tests and benchmarks drive:
# the real peers (OpenSSH, dante, tinyproxy, redis, socat, iperf3, nginx), the
# unmodified programs the preload shim is tested on (curl, wget, netcat,
# git, python3), the lab's tools (iproute2, nftables, iptables), the
# readers of what vlink generates for shells and man (zsh, groff),
# systemd's unit checker for the example unit (systemd-analyze), and pgrep,
# which finds what a launched job left behind; the baselines of
# bench/connect_cost.sh (haproxy, proxychains4, microsocks); and the UDP
# peers of the datagram tests (dnsmasq, queried with dig, and Dante's
# SOCKS client library, socksify, which speaks SOCKS5 UDP ASSOCIATE).
# Idempotent and quiet: installed packages are left alone, and the package
# lists are refreshed only when something is missing. CI runs it as root;
# elsewhere it uses sudo if it has to install anything. With --list, it
# prints the packages it would install, one per line, and installs nothing.
set -euo pipefail

# package:command pairs; a package counts as present when its command is on
# PATH (python3 may come from pyenv) or dpkg says it is installed.
packages=(
  socat:socat iperf3:iperf3 curl:curl wget:wget python3:python3 git:git
  netcat-openbsd:nc openssh-server:sshd openssh-client:ssh
  dante-server:danted tinyproxy:tinyproxy
  redis-server:redis-server redis-tools:redis-cli
  iproute2:ip nftables:nft iptables:iptables
  nginx:nginx gcc:gcc libc6-dev:
  zsh:zsh groff-base:groff systemd:systemd-analyze procps:pgrep util-linux:setsid
  haproxy:haproxy proxychains4:proxychains4 microsocks:microsocks
  dnsmasq:dnsmasq bind9-dnsutils:dig dante-client:socksify
  slurmctld:slurmctld slurmd:slurmd slurm-client:sbatch munge:munged
  openmpi-bin:mpirun bsdutils:script
)

if [ "${1:-}" = --list ]; then
  for pair in "${packages[@]}"; do echo "${pair%%:*}"; done
  exit 0
fi

missing=()
for pair in "${packages[@]}"; do
  p=${pair%%:*} cmd=${pair#*:}
  if [ -n "$cmd" ] && { command -v "$cmd" || [ -x "/usr/sbin/$cmd" ]; } >/dev/null 2>&1; then
    continue
  fi
  if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ]; then
    continue
  fi
  missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "deps.sh: missing ${missing[*]}; run as root (or install sudo)" >&2
    exit 1
  fi
  sudo=(sudo)
fi

echo "deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Packages must not start their daemons here: the tests start their own
# instances on loopback, with their own configuration.
policy=/usr/sbin/policy-rc.d
added_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
  "${sudo[@]}" chmod +x "$policy"
  added_policy=1
fi
trap 'if [ -n "$added_policy" ]; then "${sudo[@]}" rm -f "$policy"; fi' EXIT
"${sudo[@]}" apt-get update -qq >/dev/null
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
