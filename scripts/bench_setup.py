"""First-run and re-run times of `fab setup` against a local sshd this script starts.

    .venv/bin/python scripts/bench_setup.py [--runs 3]

The node is this machine (no GPU): the driver step is skipped (--allow-no-gpu), PyTorch
(torch==2.13.0, CPU) goes into a fresh venv from the machine's pip configuration, and, where
loop devices can be attached, scratch is built on a 64 MB loop device. The first run does the
work; every re-run must change nothing. Target: an idempotent re-run under 10 s.
Needs root, openssh-server and sudo (as the tests do).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infra.usage import OneLineParser, fit, whole_number  # noqa: E402
from tests.support.sshd import running_sshd, skip_reason  # noqa: E402

TARGET_RERUN_S = 10.0


def fab(args: list[str]) -> tuple[float, dict[str, object]]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "fabric", *args, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(
            f"fab {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    doc: dict[str, object] = json.loads(proc.stdout)
    return elapsed, doc


def attach_loop(work: Path) -> str | None:
    if shutil.which("losetup") is None or not Path("/dev/loop-control").exists():
        return None
    image = work / "scratch.img"
    with image.open("wb") as f:
        f.truncate(64 * 1024 * 1024)
    proc = subprocess.run(
        ["losetup", "--find", "--show", str(image)], capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def main() -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=whole_number(1, 50), default=3, help="re-runs after the first: 1-50 (3)"
    )
    args = parser.parse_args()
    reason = skip_reason()
    if reason:
        print(fit(f"cannot benchmark: {reason}"), file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-", dir="/var/tmp"))
    work.chmod(0o755)
    loop = attach_loop(work)
    try:
        with running_sshd() as sshd:
            setup = [
                *sshd.fab_args(),
                "setup",
                # every run starts an sshd with a new host key: keep its pin with the run
                "--known-hosts",
                str(work / "known_hosts"),
                "--allow-no-gpu",
                "--no-watchdog-timer",  # this machine runs no systemd
                "--torch-index",
                "default",
                "--venv",
                str(work / "venv"),
                "--scratch-path",
                str(work / "scratch"),
                "--fstab",
                str(work / "fstab"),
            ]
            if loop:
                setup += ["--scratch-devices", loop]
            first, doc = fab(setup)
            reruns = []
            for _ in range(args.runs):
                elapsed, again = fab(setup)
                if again["changed"]:
                    raise SystemExit(f"re-run changed something:\n{json.dumps(again, indent=2)}")
                reruns.append(elapsed)
        hosts = doc["hosts"]
        assert isinstance(hosts, list)
        steps = {s["step"]: f"{s['status']} {s['seconds']:.1f}s" for s in hosts[0]["steps"]}
        print("fab setup against a local sshd (no GPU; torch 2.13.0 CPU from local pip)")
        print(f"  scratch: {'loop device ' + loop if loop else 'no loop device: skipped'}")
        print(f"  first run:  {first:6.2f} s   ({', '.join(f'{k} {v}' for k, v in steps.items())})")
        print(
            f"  re-run:     {statistics.median(reruns):6.2f} s median of {len(reruns)} "
            f"(min {min(reruns):.2f}, max {max(reruns):.2f}); nothing changed"
        )
        verdict = "PASS" if max(reruns) < TARGET_RERUN_S else "FAIL"
        print(f"  target: idempotent re-run < {TARGET_RERUN_S:.0f} s: {verdict}")
        return 0 if verdict == "PASS" else 1
    finally:
        subprocess.run(["umount", "-q", str(work / "scratch")], check=False)
        if loop:
            subprocess.run(["losetup", "-d", loop], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "200")
    raise SystemExit(main())
