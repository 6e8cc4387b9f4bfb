"""Getting the node-side files onto a node and running them: the command line
(:func:`node_command`, pure), the one-round-trip copy (:func:`ship_command`) and
:func:`run_on_node`, which ships, runs one stage, fetches the report and cleans up.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import shlex
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabric import Connection

from bootstrap.fleet import node_package
from bootstrap.fleet.api import Host, HostContext, StepFailed
from bootstrap.fleet.interconnect import FabricEnv
from bootstrap.fleet.system import ProgressStream, sh
from bootstrap.tasks.pytorch import DEFAULT_VENV
from bootstrap.verify.expected import Expected
from bootstrap.verify.judge import ReportError, parse_report

# The node tools verify-gpu and fab health run, shipped with what they import in the node
# package (the bucket probe's client is the watchdog's own: one client, one signing, the
# node's role credentials, with the node clouds); torchrun runs verify_train per rank.
TOOLS = ("verify_node", "verify_train", "verify_health")
TOOL = "verify_node"
REMOTE_FILES = tuple(node_package.closure(*TOOLS))


@dataclass(frozen=True)
class VerifyOptions:
    python: str = f"{DEFAULT_VENV}/bin/python"
    cpu: bool = False
    quick: bool = False
    nproc: int = 2
    steps: int = 0
    scratch_mb: int = 4096
    timeout_s: float = 600.0
    node_env: Mapping[str, str] = field(default_factory=dict)
    s3_endpoint: str | None = None
    master_addr: str | None = None
    master_port: int = 29512
    # The fabric's NCCL/UCX defaults (bootstrap/fleet/interconnect.py), set for the cross-node
    # stage; ``node_env`` (the user's --node-env) is merged over them and always wins.
    fabric: FabricEnv = field(default_factory=FabricEnv)

    def stage_env(self, stage: str) -> dict[str, str]:
        """The environment one stage runs with: the fabric's defaults across nodes only."""
        return self.fabric.merged(self.node_env) if stage == "cross" else dict(self.node_env)


@dataclass(frozen=True)
class VerifyInputs:
    """What verify-gpu's steps read (in ``Options.tasks``): its options, what a healthy node
    of the tier does, each host's rank for the cross-node stage and its rendezvous address,
    and the saved report for the upload step."""

    verify: VerifyOptions
    expected: Expected
    ranks: Mapping[Host, int] = field(default_factory=dict)
    master_addr: str = "127.0.0.1"
    report: Path | None = None


def parse_node_env(text: str) -> dict[str, str]:
    """``KEY=VALUE,KEY=VALUE`` (``--node-env``) -> a dict; ValueError names a bad item."""
    env: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.replace("_", "").isalnum() or key[0].isdigit():
            raise ValueError(f"--node-env item {item!r} is not KEY=VALUE")
        env[key] = value
    return env


def node_command(
    remote_dir: str,
    opts: VerifyOptions,
    exp: Expected,
    *,
    stage: str = "local",
    node_rank: int = 0,
    nnodes: int = 1,
    master_addr: str = "127.0.0.1",
) -> str:
    """The shell command that runs verify_node.py on the node (pure, so it is tested)."""
    args = [
        f"--out={remote_dir}/report-{stage}.json",
        f"--workdir={remote_dir}/run-{stage}",
        f"--stage={stage}",
        f"--mode={'cpu' if opts.cpu else 'gpu'}",
        f"--nproc={opts.nproc}",
        f"--timeout={opts.timeout_s:g}",
        f"--scratch={exp.scratch.path}",
        f"--scratch-mb={opts.scratch_mb}",
    ]
    if exp.gpu and not opts.cpu:
        args += [f"--dtype={exp.gpu.training_dtype}", f"--peak-tflops={exp.gpu.peak_tflops:g}"]
    if opts.quick:
        args.append("--quick")
    if opts.steps:
        args.append(f"--steps={opts.steps}")
    args += _bucket_args(opts, exp, bucket=stage == "local")
    if stage == "cross":
        args += [
            f"--nnodes={nnodes}",
            f"--node-rank={node_rank}",
            f"--master-addr={master_addr}",
            f"--master-port={opts.master_port}",
        ]
    run = node_package.module_argv(opts.python, remote_dir, TOOL, env=opts.stage_env(stage))
    return " ".join(shlex.quote(a) for a in [*run, *args])


def _bucket_args(opts: VerifyOptions, exp: Expected, *, bucket: bool) -> list[str]:
    """Where the stack's bucket is, for the node's own client (``--bucket`` only with
    ``bucket``: the cross-node stage reaches no bucket)."""
    named = (
        ("bucket", exp.bucket if bucket else ""),
        ("provider", exp.provider),
        ("region", exp.region),
        ("s3-endpoint", opts.s3_endpoint),
    )
    return [f"--{name}={value}" for name, value in named if value]


def upload_command(remote_dir: str, opts: VerifyOptions, exp: Expected, report: str) -> str:
    """The shell command that copies ``report`` (on the node) into the stack's bucket
    with the node's own client and identity (verify_node.py --upload-report)."""
    args = [
        *node_package.module_argv(opts.python, remote_dir, TOOL, env=opts.stage_env("local")),
        f"--upload-report={report}",
        *_bucket_args(opts, exp, bucket=True),
    ]
    return " ".join(shlex.quote(a) for a in args)


# The most of a file one command line carries (Linux caps one argument at 128 KiB).
FILE_PIECE = 64_000


def write_file_commands(path: str, data: bytes) -> list[str]:
    """Commands that write ``data`` to ``path`` on the node: gzipped, base64, one piece per
    command line (no SFTP, as :func:`ship_command`), decoded once all pieces are there."""
    b64 = base64.b64encode(gzip.compress(data, mtime=0)).decode()
    q, part = shlex.quote(path), shlex.quote(f"{path}.b64")
    pieces = [b64[i : i + FILE_PIECE] for i in range(0, len(b64), FILE_PIECE)]
    return [
        *(f"printf %s {p} {'>' if i == 0 else '>>'} {part}" for i, p in enumerate(pieces)),
        f"base64 -d {part} | gunzip > {q} && rm -f {part}",
    ]


def upload_on_node(conn: Connection, ctx: HostContext, report: Path) -> dict[str, Any]:
    """Ship the node files and the saved ``report``, upload it from the node, clean up.
    Returns what verify_node.py --upload-report said; StepFailed when it said nothing."""
    given = ctx.options.need(VerifyInputs)
    opts = given.verify
    remote = ship(conn)
    target = f"{remote}/{report.name}"
    try:
        for command in write_file_commands(target, report.read_bytes()):
            wrote = sh(conn, command, timeout=60)
            if not wrote.ok:
                why = (str(wrote.stderr) or str(wrote.stdout)).strip()[-300:]
                raise StepFailed(f"could not copy the report to the node: {why}")
        cmd = upload_command(remote, opts, given.expected, target)
        done = sh(conn, cmd, timeout=420)
    finally:
        sh(conn, f"rm -rf {shlex.quote(remote)}", timeout=60)
    try:
        result = json.loads(str(done.stdout).strip() or "null")
    except ValueError:
        result = None
    if not isinstance(result, dict):
        tail = (str(done.stderr) or str(done.stdout)).strip()[-300:]
        raise StepFailed(f"the node's upload said nothing (exit {done.exited}): {tail}")
    return result


def remote_bundle() -> str:
    """The node-side files as base64 of a gzipped tar, small enough for one command line.

    The same files give the same bundle (no time stamps inside), so the command is stable."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in REMOTE_FILES:
            data = node_package.source(name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(gzip.compress(buf.getvalue(), mtime=0)).decode()


def ship_command(bundle: str) -> str:
    """One round trip: a fresh temp dir on the node with the files unpacked, its path printed.

    Sent inside the command rather than over SFTP, which hardened images sometimes disable;
    Linux caps one argument at 128 KiB, the bundle is a fraction of that."""
    if len(bundle) > 100_000:
        raise ValueError(f"node bundle too large for one command line ({len(bundle)} bytes)")
    return (
        "d=$(mktemp -d /tmp/gpufleet-verify.XXXXXX) && "
        f'printf %s {bundle} | base64 -d | tar -xzf - -C "$d" && echo "$d"'
    )


def ship(conn: Connection) -> str:
    """Copy the node-side files into a fresh temp dir on the node; returns its path."""
    made = sh(conn, ship_command(remote_bundle()), timeout=60)
    remote = str(made.stdout).strip()
    if not made.ok or not remote.startswith("/tmp/gpufleet-verify."):
        why = (str(made.stderr) or str(made.stdout)).strip()[-300:]
        raise StepFailed(f"could not copy the verify files to the node (needs base64, tar): {why}")
    return remote


def run_on_node(
    conn: Connection,
    ctx: HostContext,
    stage: str,
    after: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Ship, run one stage, fetch its report, clean up. Report problems become measurements
    with ``report_error`` so the verdict shows them instead of a traceback. ``after`` runs
    with the shipped folder and the measurements before the folder is removed (the health
    verdict uses the files already there)."""
    opts = ctx.options.need(VerifyInputs).verify
    py = shlex.quote(opts.python)
    if not sh(conn, f"test -x {py}", timeout=30).ok:
        raise StepFailed(
            f"no Python at {opts.python} on the node: run `fab install-pytorch` first, or pass "
            "--python with the interpreter that has torch"
        )
    remote = ship(conn)
    try:
        measurements = _run_stage(conn, ctx, remote, stage)
        if after is not None:
            after(remote, measurements)
    finally:
        cleanup_error = remove(conn, remote)
    note_cleanup(ctx, measurements, cleanup_error)
    return measurements


def note_cleanup(ctx: HostContext, report: dict[str, Any], error: str) -> None:
    """A shipped folder ``remove`` could not remove (``error``, "" when it is gone): not a
    verdict on the node, but a folder left in its /tmp, so it is said and kept in the
    report."""
    if error:
        report["cleanup_error"] = error
        ctx.progress(error)


def remove(conn: Connection, remote: str) -> str:
    """Remove a shipped folder; what went wrong, or "" when it is gone."""
    cleaned = sh(conn, f"rm -rf {shlex.quote(remote)}", timeout=60)
    if cleaned.ok:
        return ""
    why = (str(cleaned.stderr) or str(cleaned.stdout)).strip()[-200:]
    return f"could not remove {remote} (exit {cleaned.exited}): {why}"


def _run_stage(conn: Connection, ctx: HostContext, remote: str, stage: str) -> dict[str, Any]:
    given = ctx.options.need(VerifyInputs)
    opts = given.verify
    cmd = node_command(
        remote,
        opts,
        given.expected,
        stage=stage,
        node_rank=given.ranks.get(ctx.host, 0),
        nnodes=len(given.ranks) or 1,
        master_addr=given.master_addr,
    )
    ctx.progress(f"running verify_node.py ({stage})")
    # verify_node.py reports its own failures in the JSON it writes; its exit status only
    # matters when it wrote nothing, and then it is part of the message.
    result = conn.run(
        cmd,
        warn=True,
        hide=True,
        in_stream=False,
        timeout=opts.timeout_s + 300,
        err_stream=ProgressStream(ctx, r"^verify: "),
    )
    fetched = sh(conn, f"cat {shlex.quote(remote)}/report-{stage}.json", timeout=60)
    if not fetched.ok:
        tail = " | ".join((str(result.stderr) or str(result.stdout)).strip().splitlines()[-4:])
        return {"report_error": f"the node wrote no report (exit {result.exited}): {tail}"}
    try:
        return parse_report(str(fetched.stdout))
    except ReportError as exc:
        return {"report_error": str(exc)}
