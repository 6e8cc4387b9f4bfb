"""Benchmark: how long `fab train` and `fab train --resume` take to get a job training.

Two real sshd "nodes" on 127.0.0.1, a moto S3 bucket, the example script as a 2 x 2-process
gloo job on CPUs (the node venv is made with `fab install-pytorch` unless --venv names one).

    launch overhead  from starting `fab train` until the first training step has run on
                     both nodes (the last rank's "first step" time)
    resume overhead  from starting `fab train --resume` (after the job was killed) until the
                     first resumed step on both nodes

Each is printed in seconds and as a ratio to a bare `ssh node true` round trip measured in
the same run (OpenSSH client, median of several). Most of either is torchrun and `import
torch` in each rank, which depends on the machine, not on gpufleet. GPU throughput is not
measured here (no GPU): tokens/s on a GPU is unmeasured.

Needs root (the sshds switch users), openssh-server and sudo, as the tests do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infra.usage import OneLineParser  # noqa: E402
from tests.support.sshd import SshServer, skip_reason, start_sshd, stop_sshd  # noqa: E402

BUCKET = "gpufleet-bench-train"


def fab(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabric", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def ssh_round_trip(server: SshServer, runs: int) -> float:
    argv = [
        "ssh", "-i", str(server.key_path), "-p", str(server.port),
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", f"{server.user}@127.0.0.1", "true",
    ]  # fmt: skip
    times = []
    for _ in range(runs):
        t0 = time.monotonic()
        subprocess.run(argv, check=True, capture_output=True, timeout=60)
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def first_steps(jobs: Path, job: str, ranks: int, after: float, timeout: float) -> float:
    """Wall time (Unix) at which every rank has logged a first step later than ``after``."""
    deadline = time.monotonic() + timeout
    pattern = re.compile(r"first step \d+ at ([0-9.]+)")
    while time.monotonic() < deadline:
        seen = []
        for r in range(ranks):
            log = jobs / job / "logs" / f"rank-{r}.log"
            text = log.read_text() if log.exists() else ""
            stamps = [float(m.group(1)) for m in pattern.finditer(text)]
            stamps = [s for s in stamps if s > after]
            if stamps:
                seen.append(min(stamps))
        if len(seen) == ranks:
            return max(seen)
        time.sleep(0.1)
    raise SystemExit(f"bench_train: no first step on every rank within {timeout:g} s")


def kill_job(jobs: Path, job: str) -> None:
    for path in (jobs / job).glob("node-*/state.json"):
        state = json.loads(path.read_text())
        for key, kill in (("pgid", os.killpg), ("pid", os.kill)):
            if state.get(key):
                with contextlib.suppress(ProcessLookupError):
                    kill(int(state[key]), signal.SIGKILL)
        for pidfile in path.parent.glob("rank-*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


def _bench_env(home: Path) -> dict[str, str]:
    """fab's environment: a private HOME, no console host keys, moto's test credentials."""
    env = {
        **os.environ,
        "HOME": str(home),
        "GPUFLEET_CONSOLE_HOST_KEYS": "0",
        "COLUMNS": "200",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    env.pop("GPUFLEET_INVENTORY", None)
    return env


def _s3(url: str) -> Any:
    import boto3

    return boto3.client(
        "s3", endpoint_url=url, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip


def _write_inventory(inv: Path, nodes: tuple[SshServer, SshServer], scratch: Path) -> None:
    """The two local sshd "nodes" as a stack's inventory (what fab train reads)."""
    a = nodes[0]
    inv.write_text(
        json.dumps(
            {
                "stack": "bench-train", "provider": "aws", "region": "us-east-1",
                "bucket": BUCKET, "tier": {"name": "local", "efa": False},
                "nodes": [
                    {"name": f"node-{i}", "role": "head" if i == 0 else "worker",
                     "public_ip": "127.0.0.1", "private_ip": "127.0.0.1",
                     "ssh_port": s.port}
                    for i, s in enumerate(nodes)
                ],
                "ssh_user": a.user, "ssh_key": str(a.key_path),
                "scratch": {"path": str(scratch), "kind": "disk"},
            }
        )
    )  # fmt: skip


def _failed(done: subprocess.CompletedProcess[str]) -> int:
    print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
    return 1


def _wait_for_checkpoint(url: str, prefix: str, timeout: float = 300) -> None:
    """Until a checkpoint under ``prefix`` is complete in the bucket (bounded)."""
    client = _s3(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        keys = [o["Key"] for o in client.list_objects_v2(
            Bucket=BUCKET, Prefix=prefix).get("Contents", [])]  # fmt: skip
        if any(k.endswith("/COMPLETE") for k in keys):
            return
        time.sleep(0.5)


def _measure(
    a: SshServer, base: Path, venv: Path, url: str, env: dict[str, str], ssh_runs: int
) -> int:
    """Launch, reclaim and resume one job on the two nodes; print the overheads."""
    scratch, jobs = base / "scratch", base / "jobs"
    inv = base / "inventory.json"
    ssh_s = ssh_round_trip(a, ssh_runs)
    common = ["--inventory", str(inv), "--jobs-dir", str(jobs)]
    t0 = time.time()
    started = fab(
        "train", *common, "--script", "examples/train_lm.py", "--cpu",
        "--nproc-per-node", "2", "--venv", str(venv), "--s3-endpoint", url,
        "--node-env", "AWS_ACCESS_KEY_ID=testing,AWS_SECRET_ACCESS_KEY=testing",
        "--sync-interval", "1", "--args", "--steps 400 --step-sleep 0.1 --ckpt-every 5",
        env=env,
    )  # fmt: skip
    match = re.search(r"job (\S+) running", started.stdout)
    if started.returncode != 0 or not match:
        return _failed(started)
    job = match.group(1)
    returned = time.time() - t0
    launch = first_steps(jobs, job, 4, t0, 300) - t0
    # Wait for a checkpoint to be uploaded, then kill every process (a spot reclaim).
    _wait_for_checkpoint(url, f"checkpoints/node-0/{job}/")
    kill_job(jobs, job)
    time.sleep(1.0)
    shutil.rmtree(scratch / "checkpoints" / job, ignore_errors=True)
    t1 = time.time()
    again = fab("train", "--resume", job, *common, env=env)
    if again.returncode != 0:
        return _failed(again)
    resume = first_steps(jobs, job, 4, t1, 300) - t1
    fab("cancel", job, *common, "--wait", "30", env=env)
    print(f"ssh round trip (median of {ssh_runs}): {ssh_s:.3f} s")
    print(f"fab train returned after:      {returned:6.2f} s  ({returned / ssh_s:6.1f}x ssh)")
    print(f"launch overhead (first step):  {launch:6.2f} s  ({launch / ssh_s:6.1f}x ssh)")
    print(f"resume overhead (first step):  {resume:6.2f} s  ({resume / ssh_s:6.1f}x ssh)")
    print("2 nodes x 2 gloo processes on this machine's CPUs; tokens/s on a GPU: unmeasured")
    return 0


def main() -> int:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--venv", help="node venv with torch (default: fab install-pytorch)")
    p.add_argument("--ssh-runs", type=int, default=7)
    args = p.parse_args()
    reason = skip_reason()
    if reason:
        print(f"bench_train: {reason}", file=sys.stderr)
        return 2
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log

    base = Path(tempfile.mkdtemp(prefix="gpufleet-bench-train-", dir="/var/tmp"))
    base.chmod(0o755)
    home = base / "home"
    home.mkdir()
    env = _bench_env(home)
    a = start_sshd()
    b = start_sshd()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    moto.start()
    try:
        auth = b.workdir / "authorized_keys"
        auth.write_text(auth.read_text() + Path(f"{a.key_path}.pub").read_text())
        host, port = moto.get_host_and_port()
        url = f"http://{host}:{port}"
        _s3(url).create_bucket(Bucket=BUCKET)
        scratch, jobs = base / "scratch", base / "jobs"
        for d in (scratch, jobs):
            d.mkdir()
            d.chmod(0o777)
        venv = Path(args.venv) if args.venv else base / "venv"
        if not args.venv:
            made = fab(
                "-H", a.host_string(), "-i", str(a.key_path), "install-pytorch",
                "--allow-no-gpu", "--torch-index", "default", "--venv", str(venv), env=env,
            )  # fmt: skip
            if made.returncode != 0:
                return _failed(made)
        _write_inventory(base / "inventory.json", (a, b), scratch)
        return _measure(a, base, venv, url, env, args.ssh_runs)
    finally:
        moto.stop()
        stop_sshd(a)
        stop_sshd(b)
        subprocess.run(["rm", "-rf", str(base)], check=False)


if __name__ == "__main__":
    sys.exit(main())
