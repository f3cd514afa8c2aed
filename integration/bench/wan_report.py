"""The table of the WAN lab scripts (parallel_wan.sh, quic_wan.sh).

read() takes the rows lab_iperf (lib.sh) appended; report() prints, per
profile and path, the median Mbit/s over the rounds (min..max), the ratio
to the path "tcp" (one TCP flow), and the CPU seconds per GB received of
everything (both iperf3 ends and the vlink processes) and of each vlink
process: serve, and the tunnel.
"""
import statistics


def read(path):
    rows = {}
    for line in open(path):
        profile, p, mbps, nbytes, icpu, serve, tunnel = line.split()
        rows.setdefault(profile, {}).setdefault(p, []).append((float(mbps), int(nbytes), float(icpu), float(serve), float(tunnel)))
    return rows


def median(runs):
    return statistics.median(r[0] for r in runs)


def report(rows, base="tcp"):
    """base names the path the ratios are to (one TCP flow by default)."""
    for profile, paths in rows.items():
        b = median(paths.get(base, [(float("nan"), 1, 0, 0, 0)]))
        print(f"{profile}")
        print(f"  {'path':<15} {'Mbit/s':>8} {'min..max':>16} {'x ' + base:>8} {'CPU s/GB':>9} {'serve':>6} {'tunnel':>6}")
        for path, runs in paths.items():
            m = [r[0] for r in runs]
            gb = sum(r[1] for r in runs) / 1e9
            per_gb = lambda s: s / gb if gb else float("nan")
            cpu = per_gb(sum(r[2] + r[3] + r[4] for r in runs))
            serve, tunnel = per_gb(sum(r[3] for r in runs)), per_gb(sum(r[4] for r in runs))
            med = median(runs)
            print(f"  {path:<15} {med:8.1f} {min(m):7.1f}..{max(m):7.1f} {med / b:8.2f} {cpu:9.2f} {serve:6.2f} {tunnel:6.2f}")
