"""The watchdog's systemd units, checked by systemd itself (`systemd-analyze verify`).

This check ran in tests/gpufleet_node/test_watchdog.py until that file was reorganised; it is the
only test of the units against systemd's own parser, so it lives here now.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.support.real import missing_real_part

REMOTE = Path(__file__).resolve().parents[2] / "gpufleet_node"
UNITS = ("gpufleet-watchdog.service", "gpufleet-watchdog.timer")


def test_systemd_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        missing_real_part("no systemd-analyze on PATH", package="systemd")
    for unit in UNITS:
        shutil.copy(REMOTE / unit, tmp_path / unit)
    done = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / u) for u in UNITS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    problems = [ln for ln in done.stderr.splitlines() if "gpufleet-watchdog" in ln]
    assert done.returncode == 0, done.stderr
    assert not problems, problems
