#!/usr/bin/env python3
"""Benchmark: wall time of the offline plan per stack, as a person runs it (a fresh process).

Prints one row per stack (the target is under 5 s each on a 2-core machine), the whole
stacks suite, and the ratio against a baseline measured in the same run: a bare Python
process that only imports pulumi and the provider SDK (the floor no plan can beat).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout even before `pip install -e .`
    sys.path.insert(0, str(ROOT))

from infra.stackfiles import stack_names  # noqa: E402

TARGET_S = 5.0


def timed(cmd: list[str], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> int:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    stacks = stack_names()
    floor = timed(
        [sys.executable, "-c", "import pulumi, pulumi_aws.ec2, pulumi_alicloud.ecs"], repeat
    )
    print(f"baseline (python + import pulumi, pulumi_aws.ec2, pulumi_alicloud.ecs): {floor:.2f} s")
    print(f"{'stack':<12} {'plan s':>8} {'x baseline':>11}  target < {TARGET_S:.0f} s")
    total, worst = 0.0, 0.0
    for stack in stacks:
        t = timed([sys.executable, "scripts/plan.py", "--stack", stack, "--json"], repeat)
        total += t
        worst = max(worst, t)
        print(f"{stack:<12} {t:8.2f} {t / floor:11.2f}  {'ok' if t < TARGET_S else 'SLOW'}")
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/infra/test_stacks.py",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    suite = time.perf_counter() - start
    print(f"all {len(stacks)} plans, one process each: {total:.2f} s (worst {worst:.2f} s)")
    print(f"stack invariant suite (all stacks, one process): {suite:.2f} s")
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
