"""A node that comes back resumes its part of a run by itself (issue 41).

Standard library only, Python 3.10+. A spot node the cloud stopped (a reclaim) and that
the cloud or the stack's scheduled function started again boots with its job folders as
they were: a state.json that says running or starting under an older boot id. At boot,
``gpufleet-jobs-boot.service`` (installed by ``job_runner start`` for a job with
``reclaim_recovery``, rendered from the install's own paths) runs::

    PYTHONPATH=<runner> python3 -m gpufleet_node.job_runner boot --root <jobs root>

which starts a supervisor with ``--rejoin`` for each such job and node: one node -> a new
attempt (the interrupted one recorded as ``reclaimed``: no --max-restarts used, its time
in the spend); a worker of a multi-node run -> it joins the head's newest attempt from
the bucket records (job_group.py); the head -> a new attempt every other node joins.

A node that ``fab recover`` set up afresh (job.json and workdir shipped, no state yet)
joins the same way::

    PYTHONPATH=<runner> python3 -m gpufleet_node.job_runner start \
        --job-dir <jobs root>/<job> --node-rank <r> --rejoin

(``<runner>``: the folder fab ships the runner into, ``<jobs root>/bin-<sha>``:
bootstrap/train/steps.py runner_path; the unit names the one that installed it.)
``start`` installs the unit for a job with ``reclaim_recovery`` unless its job.json
says ``boot_unit: false`` (tests: their machine is no node). The boot id this reads is
``GPUFLEET_BOOT_ID`` when set (job_runner.BOOT_ID_ENV: a seam for tests only).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

UNIT = "gpufleet-jobs-boot.service"
UNIT_DIR = "/etc/systemd/system"
ACTIVE = ("starting", "running")


def interrupted(state: Mapping[str, Any], spec: Mapping[str, Any], current_boot: str) -> bool:
    """Whether a node's state is a run a reclaim interrupted that this boot resumes: it
    says active under another boot id, and the job asked for recovery on reclaim."""
    if state.get("state") not in ACTIVE or not spec.get("reclaim_recovery"):
        return False
    was = str(state.get("boot_id") or "")
    return bool(was and current_boot and was != current_boot)


def to_resume(root: Path, current_boot: str, read: Any) -> list[tuple[Path, int]]:
    """(job folder, node rank) of every interrupted run under ``root`` (``read``: a JSON
    reader returning None for an unreadable file)."""
    out: list[tuple[Path, int]] = []
    if not root.is_dir():
        return out
    for job_dir in sorted(p for p in root.iterdir() if (p / "job.json").is_file()):
        spec = read(job_dir / "job.json") or {}
        for path in sorted(job_dir.glob("node-*/state.json")):
            state = read(path) or {}
            if interrupted(state, spec, current_boot):
                out.append((job_dir, int(state.get("node_rank") or 0)))
    return out


def systemd_quote(arg: str) -> str:
    """One argument of an ExecStart= line as systemd reads it back: double-quoted with C
    escapes, ``%%`` for a literal ``%`` and ``$$`` for a literal ``$`` (systemd.service(5)
    "Command lines", systemd.unit(5) "Specifiers"); as bootstrap/tasks/watchdog.py does."""
    if arg and all(ch.isalnum() or ch in "/_.:+-=,@" for ch in arg):
        return arg
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("%", "%%").replace("$", "$$") + '"'


def systemd_env_quote(assignment: str) -> str:
    """One ``VAR=value`` of an Environment= line (no ``$`` expansion there)."""
    if all(ch.isalnum() or ch in "/_.:+-=,@" for ch in assignment):
        return assignment
    escaped = assignment.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("%", "%%") + '"'


def render_unit(python: str, bin_dir: str, root: str, user: str) -> str:
    """The boot unit for this install: ``python -m gpufleet_node.job_runner boot --root
    ROOT`` as ``user`` with the shipped package (``bin_dir``) on PYTHONPATH, each path
    quoted for systemd. KillMode=process: the supervisors it starts (forked, or their own
    systemd-run units) outlive the oneshot."""
    exec_start = " ".join(
        systemd_quote(a) for a in (python, "-m", "gpufleet_node.job_runner", "boot", "--root", root)
    )
    doc = "file://" + urllib.parse.quote(f"{bin_dir}/gpufleet_node/job_boot.py")
    lines = [
        "# gpufleet: at boot, resume the runs a spot reclaim interrupted (job_boot.py).",
        "# Installed by `fab train` (job_runner start) for a job with reclaim recovery.",
        "[Unit]",
        "Description=gpufleet: resume interrupted training runs after a reboot",
        "Documentation=" + doc.replace("%", "%%"),
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=oneshot",
        "User=" + systemd_quote(user),
        "Environment=" + systemd_env_quote(f"PYTHONPATH={bin_dir}"),
        f"ExecStart={exec_start}",
        "KillMode=process",
        "TimeoutStartSec=10min",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def install_unit(text: str, *, sudo: bool, unit_dir: str = UNIT_DIR) -> dict[str, Any]:
    """The unit in ``unit_dir``, enabled; {ok, detail}. No systemd or no sudo: said, not
    an error (the run goes on; a reclaimed node then waits for fab train --resume)."""
    if not Path("/run/systemd/system").is_dir() or shutil.which("systemctl") is None:
        return {"ok": False, "detail": "no systemd here: nothing resumes this node at boot"}
    path = f"{unit_dir}/{UNIT}"
    current = ""
    with contextlib.suppress(OSError):
        current = Path(path).read_text()
    if current == text:
        return {"ok": True, "detail": f"{path} already installed"}
    pre = ["sudo", "-n"] if sudo else []
    steps = [
        [*pre, "tee", path],
        [*pre, "systemctl", "daemon-reload"],
        [*pre, "systemctl", "enable", UNIT],
    ]
    for argv in steps:
        done = subprocess.run(
            argv,
            input=text if argv[-1] == path else None,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["failed"])[-1][:200]
            return {"ok": False, "detail": f"{' '.join(argv[len(pre) :])}: {why}"}
    return {"ok": True, "detail": f"{path} installed and enabled"}
