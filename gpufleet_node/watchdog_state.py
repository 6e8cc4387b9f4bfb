"""What the watchdog keeps between runs (/var/lib/gpufleet/watchdog-state.json): the
sample history, the last tags read in this boot, the last decision. Written atomically;
a lost or unreadable file only restarts the idle clock.

Standard library only, beside watchdog.py in the node package (/opt/gpufleet/gpufleet_node/).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import idle_rules

STATE_FILE = "watchdog-state.json"
# Each running job's copy of the samples (job_runner.py's SAMPLES_FILE in its node folder),
# for its chart; a file this big takes no more (a year of runs is about 40 MB).
JOB_SAMPLES_FILE = "gpu-samples.jsonl"
JOB_SAMPLES_MAX_BYTES = 16 * 1024 * 1024


def append_job_samples(
    folders: list[Path], samples: list[tuple[idle_rules.Sample, float | None]]
) -> None:
    """This run's samples (per-GPU utilization, the fullest GPU's memory %) appended to
    each running job's node folder. A write that fails never stops the watchdog's run."""
    lines = "".join(
        json.dumps(
            {
                "at": idle_rules.format_utc(sample.at),
                "gpu_util": None if sample.gpu_util is None else list(sample.gpu_util),
                "gpu_mem": mem,
            }
        )
        + "\n"
        for sample, mem in samples
    )
    for folder in folders:
        path = folder / JOB_SAMPLES_FILE
        try:
            if path.exists() and path.stat().st_size > JOB_SAMPLES_MAX_BYTES:
                continue
            with open(path, "a") as f:
                f.write(lines)
        except OSError:
            continue


def append_job_log_line(folders: list[Path], line: str) -> int:
    """``line`` appended to the rank logs of each running job's ranks on this node (what
    `fab logs` prints), in one write per file (the ranks write with O_APPEND too). Returns
    how many logs took it; a write that fails never stops the watchdog's run."""
    written = 0
    for folder in folders:
        try:
            spec = json.loads((folder.parent / "job.json").read_text())
            nproc = int(spec.get("nproc_per_node") or 1)
            node_rank = int(folder.name.removeprefix("node-"))
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        logs = folder.parent / "logs"
        for rank in range(node_rank * nproc, (node_rank + 1) * nproc):
            try:
                fd = os.open(logs / f"rank-{rank}.log", os.O_WRONLY | os.O_APPEND)
            except OSError:
                continue  # no log yet: the rank has not started; nothing to tell
            try:
                os.write(fd, (line.rstrip("\n") + "\n").encode())
                written += 1
            except OSError:
                pass
            finally:
                os.close(fd)
    return written


@dataclass
class State:
    samples: list[idle_rules.Sample] = field(default_factory=list)
    stall_warned: bool = False
    spot_notice_synced: str = ""  # the notice we already saved scratch for
    refused_since: str = ""  # ISO time since when power-off is refused (unsynced scratch)
    # The last tags read in this boot ({"boot": ISO, "read_at": ISO, "tags": {...}}): when a
    # later read fails, a node once seen protected stays protected.
    tags: dict[str, Any] = field(default_factory=dict)
    last_decision: dict[str, Any] = field(default_factory=dict)
    # When the hard TTL stops this node and which warnings were given for that time (see
    # Watchdog.ttl_ahead); `fab status` and `fab jobs` read it.
    ttl: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> State:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls()  # a lost history only restarts the idle clock
        samples = []
        for s in raw.get("samples", []):
            try:
                samples.append(
                    idle_rules.Sample(
                        at=idle_rules.parse_utc(s["at"]),
                        gpu_util=None if s.get("gpu_util") is None else tuple(s["gpu_util"]),
                        gpu_procs=s.get("gpu_procs"),
                        ssh=s.get("ssh"),
                    )
                )
            except (KeyError, ValueError, TypeError):
                continue
        return cls(
            samples=samples,
            stall_warned=bool(raw.get("stall_warned")),
            spot_notice_synced=str(raw.get("spot_notice_synced", "")),
            refused_since=str(raw.get("refused_since", "")),
            tags=dict(raw.get("tags") or {}),
            last_decision=dict(raw.get("last_decision", {})),
            ttl=dict(raw.get("ttl") or {}) if isinstance(raw.get("ttl"), dict) else {},
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "samples": [
                {
                    "at": s.at.astimezone(idle_rules.UTC).isoformat(),
                    "gpu_util": None if s.gpu_util is None else list(s.gpu_util),
                    "gpu_procs": s.gpu_procs,
                    "ssh": s.ssh,
                }
                for s in self.samples
            ],
            "stall_warned": self.stall_warned,
            "spot_notice_synced": self.spot_notice_synced,
            "refused_since": self.refused_since,
            "tags": self.tags,
            "last_decision": self.last_decision,
            "ttl": self.ttl,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)  # atomic: a crash mid-write never leaves half a history

    def prune(self, now: dt.datetime, keep_minutes: float) -> None:
        cutoff = now - dt.timedelta(minutes=keep_minutes)
        self.samples = [s for s in self.samples if s.at >= cutoff]
