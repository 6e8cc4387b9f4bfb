"""What the watchdog samples on the node: GPU utilization and compute processes from
nvidia-smi, SSH sessions and connections from ss/who, the boot time from /proc/uptime.

Standard library only, beside watchdog.py in the node package (/opt/gpufleet/gpufleet_node/).
The parsers read the tools' recorded outputs in tests/gpufleet_node/test_watchdog.py.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from . import idle_rules


def run_cmd(argv: Sequence[str], timeout: float = 20.0) -> str | None:
    """stdout of a command, or None when it is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_gpu_query(text: str | None) -> tuple[tuple[float, ...], float] | None:
    """``utilization.gpu,memory.used,memory.total`` CSV -> (per-GPU util, max memory %)."""
    if text is None:
        return None
    utils: list[float] = []
    mem_pct = 0.0
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            return None
        try:
            util, used, total = float(parts[0]), float(parts[1]), float(parts[2])
        except ValueError:  # "[N/A]", "[Not Supported]": unreadable, which counts as active
            return None
        utils.append(util)
        if total > 0:
            mem_pct = max(mem_pct, 100.0 * used / total)
    return (tuple(utils), mem_pct) if utils else None


def parse_compute_apps(text: str | None) -> int | None:
    if text is None:
        return None
    return sum(1 for line in text.strip().splitlines() if line.strip() and line[0].isdigit())


def parse_ss(text: str | None) -> int | None:
    """Established TCP connections whose local port is 22 (sessions and ``ssh -N`` tunnels)."""
    if text is None:
        return None
    count = 0
    for line in text.strip().splitlines():
        cols = line.split()
        # ss -Htn state established: Recv-Q Send-Q Local:Port Peer:Port
        if len(cols) >= 4 and cols[2].rsplit(":", 1)[-1] == "22":
            count += 1
    return count


def parse_who(text: str | None) -> int | None:
    if text is None:
        return None
    return sum(1 for line in text.strip().splitlines() if line.strip())


class Probe(Protocol):
    def now(self) -> dt.datetime: ...
    def sleep(self, seconds: float) -> None: ...
    def boot_time(self) -> dt.datetime: ...
    def gpu(self) -> tuple[tuple[float, ...], float] | None: ...
    def gpu_procs(self) -> int | None: ...
    def ssh(self) -> int | None: ...


class SystemProbe:
    """The real node: nvidia-smi, ss, who, /proc/uptime."""

    def now(self) -> dt.datetime:
        return dt.datetime.now(idle_rules.UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def boot_time(self) -> dt.datetime:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return self.now() - dt.timedelta(seconds=uptime)

    def gpu(self) -> tuple[tuple[float, ...], float] | None:
        return parse_gpu_query(
            run_cmd(
                [
                    "nvidia-smi",
                    "--query-gpu=utilization.gpu,memory.used,memory.total",
                    "--format=csv,noheader,nounits",
                ]
            )
        )

    def gpu_procs(self) -> int | None:
        return parse_compute_apps(
            run_cmd(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"])
        )

    def ssh(self) -> int | None:
        connections = parse_ss(run_cmd(["ss", "-Htn", "state", "established"]))
        sessions = parse_who(run_cmd(["who"]))
        if connections is None and sessions is None:
            return None
        return max(connections or 0, sessions or 0)


def take_sample(probe: Probe) -> tuple[idle_rules.Sample, float | None]:
    gpu = probe.gpu()
    sample = idle_rules.Sample(
        at=probe.now(),
        gpu_util=None if gpu is None else gpu[0],
        gpu_procs=probe.gpu_procs(),
        ssh=probe.ssh(),
    )
    return sample, None if gpu is None else gpu[1]
