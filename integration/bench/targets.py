"""Targets of the bench scripts, checked where their figures are computed.

A script's report calls check() for each target with the ratio or figure
its own run measured. Each check prints one line, "met" or "MISSED"; a
missed one is recorded in the file VLINK_BENCH_MISSED names, and lib.sh
then ends the script with status 3, so that a miss is told from a
failure to run (status 1) and from success.
"""
import operator
import os

_ops = {">=": operator.ge, "<=": operator.le}


def check(name, value, op, limit, unit=""):
    ok = _ops[op](value, limit)
    print(f"  target {name}: {value:.3f}{unit} {op} {limit}{unit}: {'met' if ok else 'MISSED'}")
    if not ok and os.environ.get("VLINK_BENCH_MISSED"):
        with open(os.environ["VLINK_BENCH_MISSED"], "a") as f:
            f.write(name + "\n")
    return ok
