"""Benchmark: what `fab train` adds to a plain `torchrun --standalone` of the same script.

The same small script (a plain torch.save snapshot, as pytorch/examples' DDP tutorial
saves one) is started, in the same run and interleaved, by a plain `torchrun --standalone`
on this machine and by `fab train --follow` on a local sshd "node" (this machine too, a
moto S3 bucket as the stack's), N times each (medians):

    first line   from starting the command until the job's first line reaches it
    resume       after the first attempt crashed (having saved its snapshot): from
                 starting it again (`torchrun` again; `fab train --resume JOB --follow`)
                 until its "Resuming" line arrives

Printed: each median, the difference and the ratio. Targets (issue 24, on these loaded
2-core machines): fab's first line within 2 s of torchrun's, its resume within 3 s; the
exit status is 1 when one is missed. The node venv is made with `fab install-pytorch`
unless --venv names one. Needs root (the sshd switches users), openssh-server and sudo.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infra.usage import OneLineParser, fit, whole_number  # noqa: E402
from tests.support.sshd import skip_reason, start_sshd, stop_sshd  # noqa: E402

BUCKET = "gpufleet-bench-train"
CREDS = "AWS_ACCESS_KEY_ID=testing,AWS_SECRET_ACCESS_KEY=testing"
TARGETS = {"first_line": 2.0, "resume": 3.0}  # seconds over plain torchrun (issue 24)

# Our own script, saving the way most do: one torch.save file, loaded when it is there.
SCRIPT = """\
import argparse, os, sys, time
import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--sleep", type=float, default=0.2)
p.add_argument("--crash-after", type=int, default=-1)
a = p.parse_args()
path = os.path.join(os.environ["GPUFLEET_CHECKPOINT_DIR"], "snapshot.pt")
dist.init_process_group("gloo")
start = 0
if os.path.exists(path):
    start = torch.load(path)["epoch"] + 1
    print(f"Resuming training from snapshot at Epoch {start}", flush=True)
for epoch in range(start, a.epochs):
    print(f"epoch {epoch} begins", flush=True)
    time.sleep(a.sleep)
    torch.save({"epoch": epoch}, path)
    if epoch == a.crash_after:
        sys.exit(3)
dist.destroy_process_group()
"""
FIRST = re.compile(r"epoch \d+ begins|Resuming training")
RESUMED = re.compile(r"Resuming training from snapshot")


def first_match(argv: Sequence[str], pattern: re.Pattern[str], env: dict[str, str],
                cwd: Path, timeout: float = 300) -> tuple[float, int, str]:  # fmt: skip
    """Seconds from starting ``argv`` until a line of its output matches ``pattern``; then
    it runs to its end: (seconds, exit status, its output)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        list(argv), cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    seen, lines = None, []
    deadline = t0 + timeout
    for line in proc.stdout:
        lines.append(line)
        if seen is None and pattern.search(line):
            seen = time.monotonic() - t0
        if time.monotonic() > deadline:
            proc.kill()
            break
    rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    if seen is None:
        raise SystemExit("bench_train: no matching line:\n" + "".join(lines)[-3000:])
    return seen, rc, "".join(lines)


@dataclass
class Bench:
    """One run's setup: the node, the venv, the workdir with the script, fab's options."""

    base: Path
    venv: Path
    inventory: Path
    moto: str
    env: dict[str, str]

    @property
    def workdir(self) -> Path:
        return self.base / "work"

    def plain(self) -> tuple[float, float]:
        """torchrun --standalone here: (first line, resume) seconds."""
        ckpt = self.base / "plain-ckpt"
        shutil.rmtree(ckpt, ignore_errors=True)
        ckpt.mkdir()
        env = {**self.env, "GPUFLEET_CHECKPOINT_DIR": str(ckpt)}
        argv = [
            str(self.venv / "bin" / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            "1",
            str(self.workdir / "snapshot_job.py"),
        ]
        first, rc, out = first_match([*argv, "--crash-after", "0"], FIRST, env, self.workdir)
        if rc == 0:
            raise SystemExit("bench_train: the first attempt did not crash:\n" + out[-2000:])
        resume, rc, out = first_match(argv, RESUMED, env, self.workdir)
        if rc != 0:
            raise SystemExit(f"bench_train: plain resume exited {rc}:\n{out[-2000:]}")
        return first, resume

    def fab(self, name: str) -> tuple[float, float]:
        """fab train --follow on the node, then --resume --follow: (first line, resume)."""
        common = ["--inventory", str(self.inventory), "--jobs-dir", str(self.base / "jobs")]
        argv = [
            sys.executable, "-m", "fabric", "train", *common, "--script",
            str(self.workdir / "snapshot_job.py"), "--cpu", "--nproc-per-node", "1",
            "--venv", str(self.venv), "--s3-endpoint", self.moto, "--node-env", CREDS,
            "--name", name, "--follow", "--args", "--crash-after 0",
        ]  # fmt: skip
        first, rc, out = first_match(argv, FIRST, self.env, REPO)
        job = re.search(r"job (\S+) running", out)
        if rc == 0 or job is None:
            raise SystemExit("bench_train: fab's first attempt did not fail:\n" + out[-3000:])
        again = [sys.executable, "-m", "fabric", "train", "--resume", job.group(1), *common,
                 "--follow"]  # fmt: skip
        resume, rc, out = first_match(again, RESUMED, self.env, REPO)
        if rc != 0:
            raise SystemExit(f"bench_train: fab resume exited {rc}:\n{out[-3000:]}")
        return first, resume


def summarise(plain: list[tuple[float, float]], fab: list[tuple[float, float]]) -> dict[str, Any]:
    """Medians, differences, ratios and whether each target is met."""
    out: dict[str, Any] = {"runs": len(plain), "targets": {}}
    for i, what in enumerate(("first_line", "resume")):
        p = statistics.median(r[i] for r in plain)
        f = statistics.median(r[i] for r in fab)
        ratio = round(f / p, 2) if p else None
        out[what] = {"torchrun_s": round(p, 3), "fab_s": round(f, 3), "extra_s": round(f - p, 3)}
        out[what]["ratio"] = ratio
        out["targets"][what] = f - p <= TARGETS[what]
    return out


def exit_status(summary: dict[str, Any]) -> int:
    """0 when every target is met, 1 otherwise (make bench fails on a miss)."""
    return 0 if all(summary["targets"].values()) else 1


def report(summary: dict[str, Any]) -> str:
    lines = [f"plain torchrun --standalone vs fab train, 1 process, medians of {summary['runs']}"]
    for what, label in (("first_line", "first job line"), ("resume", "resume's first line")):
        m = summary[what]
        mark = "ok" if summary["targets"][what] else "MISSED"
        lines.append(
            f"{label:<20} torchrun {m['torchrun_s']:5.2f} s  fab {m['fab_s']:5.2f} s  "
            f"+{m['extra_s']:.2f} s (x{m['ratio']})  target +{TARGETS[what]:g} s: {mark}"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def setup(venv_arg: str | None) -> Iterator[Bench]:
    """The node (one sshd), a moto bucket, the venv and the script; all gone afterwards."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    base = Path(tempfile.mkdtemp(prefix="gpufleet-bench-train-", dir="/var/tmp"))
    base.chmod(0o755)
    (base / "home").mkdir()
    env = {**os.environ, "HOME": str(base / "home"), "GPUFLEET_CONSOLE_HOST_KEYS": "0",
           "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    env.pop("GPUFLEET_INVENTORY", None)
    node = start_sshd()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        url = f"http://{host}:{port}"
        _s3(url).create_bucket(Bucket=BUCKET)
        for d in ("scratch", "jobs", "work"):
            (base / d).mkdir()
            (base / d).chmod(0o777)
        (base / "work" / "snapshot_job.py").write_text(SCRIPT)
        venv = Path(venv_arg) if venv_arg else base / "venv"
        if not (venv / "bin" / "python").exists():  # made once where --venv names it
            made = subprocess.run(
                [sys.executable, "-m", "fabric", *node.fab_args(), "install-pytorch",
                 "--allow-no-gpu", "--torch-index", "default", "--venv", str(venv)],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False,
            )  # fmt: skip
            if made.returncode != 0:
                raise SystemExit(made.stdout[-2000:] + made.stderr[-2000:])
        inv = base / "inventory.json"
        inv.write_text(json.dumps(node.inventory(bucket=BUCKET, scratch={
            "path": str(base / "scratch"), "kind": "disk"}, stack="bench-train")))  # fmt: skip
        yield Bench(base, venv, inv, url, env)
    finally:
        moto.stop()
        stop_sshd(node)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _s3(url: str) -> Any:
    import boto3

    return boto3.client(
        "s3", endpoint_url=url, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip


def main() -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--venv",
        help="node venv with torch, made by fab install-pytorch when "
        "it is not there (default: a new one, removed afterwards)",
    )
    p.add_argument(
        "--runs", type=whole_number(1, 50), default=5, help="runs of each: 1-50 (medians; 5)"
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args()
    reason = skip_reason()
    if reason:
        print(fit(f"bench_train: {reason}"), file=sys.stderr)
        return 2
    with setup(args.venv) as bench:
        plain, fab = [], []
        for i in range(args.runs):  # interleaved: both see the same load
            plain.append(bench.plain())
            fab.append(bench.fab(f"bench-{i}"))
    summary = summarise(plain, fab)
    print(json.dumps(summary, indent=2) if args.json else report(summary))
    return exit_status(summary)


if __name__ == "__main__":
    sys.exit(main())
