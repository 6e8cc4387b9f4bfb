"""`fab install-pytorch` over real SSH shows the torch download's progress while the step
runs. The node's venv python is a stand-in that plays a pip download (a wheel file growing in
pip's temp folder) and holds at 30 % until the test lets it finish, so any progress line seen
before that was printed mid-step."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bootstrap.conftest import REPO, install_pytorch_args, node_dir
from tests.support.sshd import SshServer

pytestmark = pytest.mark.integration

FAKE_PYTHON = r"""#!/bin/sh
# Stands in for the venv's python: answers install-pytorch's version probe and plays a pip
# download that stops at 15 of 50 MB until the test creates the file "go".
here=$(dirname "$0")
case "$1" in
  -c)
    if [ -f "$here/installed" ]; then echo '{"torch": "2.13.0"}'; else echo '{"torch": null}'; fi
    ;;
  -m)
    echo "Collecting torch==2.13.0"
    url=http://127.0.0.1:9/whl/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl
    echo "  Downloading $url (50.0 MB)"
    d=$(mktemp -d "${TMPDIR:-/tmp}/pip-unpack-XXXXXXXX")
    head -c 15000000 /dev/zero > "$d/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
    i=0
    while [ ! -f "$here/go" ] && [ "$i" -lt 900 ]; do sleep 0.1; i=$((i + 1)); done
    echo "Installing collected packages: torch"
    echo "Successfully installed torch-2.13.0+cpu"
    touch "$here/installed"
    ;;
esac
"""
TICK = re.compile(r"torch 2\.13\.0\+cpu: 15 of 50 MB \(30 %\), \d+ s$")


@pytest.fixture
def fake_venv() -> Iterator[Path]:
    base = node_dir("gpufleet-fakepip-")
    bin_dir = base / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    bin_dir.chmod(0o777)  # the stand-in pip runs as root, the probe as the node user
    yield base / "venv"
    shutil.rmtree(base, ignore_errors=True)


def fab_command(server: SshServer, venv: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fabric", *install_pytorch_args(server, venv, *extra)]


def test_install_pytorch_prints_the_download_progress_while_pip_runs(
    sshd_server: SshServer, fake_venv: Path
) -> None:
    proc = subprocess.Popen(
        fab_command(sshd_server, fake_venv),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    try:
        while True:
            line = lines.get(timeout=120)
            assert line is not None, "fab ended before any progress line:\n" + "\n".join(seen)
            seen.append(line)
            if TICK.search(line):
                break
        before_go = len(seen)
        # Only now may the stand-in pip finish: the line above came while the step ran.
        (fake_venv / "bin" / "go").touch()
        while (line := lines.get(timeout=120)) is not None:
            seen.append(line)
        assert proc.wait(timeout=60) == 0, "\n".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ended = next(i for i, s in enumerate(seen) if "install-pytorch: changed" in s)
    assert ended >= before_go
    ticks = [s for s in seen if "of 50 MB" in s]
    assert ticks and all(len(s) <= 80 for s in ticks), ticks
    # piped: plain lines, no cursor movement
    assert not any("\x1b" in s for s in seen)


def test_install_pytorch_json_prints_only_the_json_document(
    sshd_server: SshServer, fake_venv: Path
) -> None:
    (fake_venv / "bin" / "go").touch()  # the stand-in pip finishes at once
    done = subprocess.run(
        fab_command(sshd_server, fake_venv, "--json"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "80"},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    steps = {s["step"]: s["status"] for s in doc["hosts"][0]["steps"]}
    assert steps["install-pytorch"] == "changed"
    assert "of 50 MB" not in done.stdout + done.stderr
