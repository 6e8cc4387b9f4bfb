"""``fab verify-gpu``: prove that each node trains at the speed it is paid for.

The node side (``bootstrap/remote/verify_node.py`` and friends) measures and returns raw
numbers as JSON; :mod:`bootstrap.verify_judge` decides, purely, against the catalog. This
module ships the node files, runs them on every node (and across nodes), renders the verdicts,
saves and uploads the report: the ``verify-gpu`` task.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json as jsonlib
import os
import shlex
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fabric import Connection
from invoke import Context
from invoke.exceptions import Exit
from rich.console import Console
from rich.table import Table
from rich.text import Text

from bootstrap.api import Host, HostContext, Options, StepFailed, StepResult, step
from bootstrap.cli import COMMON_HELP, fleet_task, resolve_fleet
from bootstrap.hosts import Fleet
from bootstrap.pytorch import DEFAULT_VENV
from bootstrap.runner import FleetReport, run_fleet
from bootstrap.system import ProgressStream, probe_step, sh
from bootstrap.verify_judge import (
    CPU_ONLY,
    FAIL,
    NOT_RUN,
    PASS,
    SKIP,
    WARN,
    Check,
    Expected,
    ReportError,
    Verdict,
    cluster_not_run,
    expected_from,
    judge,
    judge_cluster,
    overall,
    parse_report,
)
from infra.catalog import load_catalog

_STYLE = {PASS: "green", WARN: "yellow", SKIP: "cyan", NOT_RUN: "dim", FAIL: "bold red"}
_STYLE[CPU_ONLY] = "magenta"
REPORT_SCHEMA = "gpufleet.verify-report/1"
REMOTE_DIR = Path(__file__).resolve().parent / "remote"
REMOTE_FILES = ("verify_node.py", "verify_smi.py", "verify_train.py")


# ---------------------------------------------------------------------------------------------
# Rendering


def verdict_table(v: Verdict, title: str) -> Table:
    table = Table(title=f"{title}: {v.status}", title_justify="left", show_lines=False)
    for col in ("check", "status", "measured", "expected", "detail"):
        table.add_column(col, overflow="fold", no_wrap=col in ("check", "status"))
    for c in v.checks:
        table.add_row(c.name, Text(c.status, _STYLE[c.status]), c.measured, c.expected, c.detail)
    return table


def overall_line(verdicts: Sequence[Verdict], status: str) -> str:
    failed = [f"{v.host}: {', '.join(c.name for c in v.failures)}" for v in verdicts if v.failures]
    if status == FAIL:
        return f"verify-gpu: FAIL ({'; '.join(failed)})"
    if status == CPU_ONLY:
        return "verify-gpu: CPU-ONLY: the CPU training path works; the GPU tier was NOT verified"
    return f"verify-gpu: {status}"


# ---------------------------------------------------------------------------------------------
# The Fabric side


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
        opts.python,
        f"{remote_dir}/verify_node.py",
        f"--out={remote_dir}/report-{stage}.json",
        f"--workdir={remote_dir}/run-{stage}",
        f"--stage={stage}",
        f"--mode={'cpu' if opts.cpu else 'gpu'}",
        f"--nproc={opts.nproc}",
        f"--timeout={opts.timeout_s:g}",
        f"--scratch={exp.scratch.path}",
        f"--scratch-mb={opts.scratch_mb}",
        f"--provider={exp.provider or 'aws'}",
    ]
    if exp.gpu and not opts.cpu:
        args += [f"--dtype={exp.gpu.training_dtype}", f"--peak-tflops={exp.gpu.peak_tflops:g}"]
    if opts.quick:
        args.append("--quick")
    if opts.steps:
        args.append(f"--steps={opts.steps}")
    if exp.bucket and stage == "local":
        args.append(f"--bucket={exp.bucket}")
    if exp.region:
        args.append(f"--region={exp.region}")
    if opts.s3_endpoint:
        args.append(f"--s3-endpoint={opts.s3_endpoint}")
    if stage == "cross":
        args += [
            f"--nnodes={nnodes}",
            f"--node-rank={node_rank}",
            f"--master-addr={master_addr}",
            f"--master-port={opts.master_port}",
        ]
    env = [f"{k}={v}" for k, v in opts.node_env.items()]
    prefix = ["env", *env] if env else []
    return " ".join(shlex.quote(a) for a in [*prefix, *args])


def remote_bundle() -> str:
    """The node-side files as base64 of a gzipped tar, small enough for one command line."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in REMOTE_FILES:
            data = (REMOTE_DIR / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


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


def _ship(conn: Connection) -> str:
    """Copy the node-side files into a fresh temp dir on the node; returns its path."""
    made = sh(conn, ship_command(remote_bundle()), timeout=60)
    remote = str(made.stdout).strip()
    if not made.ok or not remote.startswith("/tmp/gpufleet-verify."):
        why = (str(made.stderr) or str(made.stdout)).strip()[-300:]
        raise StepFailed(f"could not copy the verify files to the node (needs base64, tar): {why}")
    return remote


def run_on_node(conn: Connection, ctx: HostContext, stage: str) -> dict[str, Any]:
    """Ship, run one stage, fetch its report, clean up. Report problems become measurements
    with ``report_error`` so the verdict shows them instead of a traceback."""
    opts: VerifyOptions = ctx.options.extra["verify"]
    exp: Expected = ctx.options.extra["expected"]
    py = shlex.quote(opts.python)
    if not sh(conn, f"test -x {py}", timeout=30).ok:
        raise StepFailed(
            f"no Python at {opts.python} on the node: run `fab install-pytorch` first, or pass "
            "--python with the interpreter that has torch"
        )
    remote = _ship(conn)
    try:
        ranks: Mapping[Host, int] = ctx.options.extra.get("ranks", {})
        cmd = node_command(
            remote,
            opts,
            exp,
            stage=stage,
            node_rank=ranks.get(ctx.host, 0),
            nnodes=len(ranks) or 1,
            master_addr=ctx.options.extra.get("master_addr", "127.0.0.1"),
        )
        ctx.progress(f"running verify_node.py ({stage})")
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
    finally:
        sh(conn, f"rm -rf {shlex.quote(remote)}", timeout=60)


def _result(measurements: dict[str, Any], ctx: HostContext, cluster: bool = False) -> StepResult:
    exp: Expected = ctx.options.extra["expected"]
    if cluster:
        return StepResult.ok("cross-node run done", measurements=measurements)
    verdict = judge(measurements, exp, host=ctx.host.label)
    message = f"{verdict.status}" + (
        f": {', '.join(c.name for c in verdict.failures)}" if verdict.failures else ""
    )
    details = {"measurements": measurements, "verdict": verdict}
    if verdict.status == FAIL:
        return StepResult.failed(message, **details)
    return StepResult.ok(message, **details)


@step("verify-node")
def verify_local_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Inventory, health and the benchmarks on one node."""
    return _result(run_on_node(conn, ctx, "local"), ctx)


@step("verify-cross-node")
def verify_cross_step(conn: Connection, ctx: HostContext) -> StepResult:
    """This node's share of the cross-node all-reduce and training step."""
    return _result(run_on_node(conn, ctx, "cross"), ctx, cluster=True)


def master_address(outputs: Mapping[str, Any] | None, fleet: Fleet, override: str | None) -> str:
    """Where the cross-node rendezvous listens: the head's private IP (the nodes reach each
    other inside the VPC), else the address we reach the head at."""
    if override:
        return override
    for node in (outputs or {}).get("nodes") or []:
        if node.get("role") == "head" and node.get("private_ip"):
            return str(node["private_ip"])
    return fleet.hosts[0].address


@dataclass
class VerifyRun:
    """Everything one ``fab verify-gpu`` produced."""

    expected: Expected
    verdicts: list[Verdict]
    cluster: Verdict | None
    measurements: dict[str, Any]
    seconds: float
    started_at: str

    @property
    def status(self) -> str:
        return overall([*self.verdicts, *([self.cluster] if self.cluster else [])])

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 2),
            "overall": self.status,
            "expected": self.expected.summary(),
            "hosts": [v.to_json() for v in self.verdicts],
            "cluster": self.cluster.to_json() if self.cluster else None,
            "measurements": self.measurements,
        }


def _host_outcomes(
    report: FleetReport, step_name: str
) -> list[tuple[str, dict[str, Any] | None, str]]:
    """(label, measurements or None, why not) per host of a runner report."""
    out: list[tuple[str, dict[str, Any] | None, str]] = []
    for h in report.hosts:
        if h.connection_error:
            out.append((h.host.label, None, h.connection_message))
            continue
        rec = next((s for s in h.steps if s.name == step_name), None)
        if rec is None or "measurements" not in rec.result.details:
            why = next((s.result.message for s in h.steps if s.result.is_failure), "not run")
            out.append((h.host.label, None, why))
        else:
            out.append((h.host.label, dict(rec.result.details["measurements"]), ""))
    return out


def verify_fleet(
    fleet: Fleet,
    exp: Expected,
    opts: VerifyOptions,
    *,
    outputs: Mapping[str, Any] | None = None,
    config: Any = None,
    console: Console | None = None,
    connect_timeout_s: float = 10.0,
) -> VerifyRun:
    """Run the local stage on every host in parallel, then (several hosts, not --quick) the
    cross-node stage on all of them at once, and judge everything."""
    started = dt.datetime.now(dt.UTC)
    ranks = {h: i for i, h in enumerate(fleet.hosts)}
    if len(ranks) != len(fleet.hosts):
        raise ValueError("the same host is listed twice")
    extra = {
        "verify": opts,
        "expected": exp,
        "ranks": ranks,
        "master_addr": master_address(outputs, fleet, opts.master_addr),
    }
    options = Options(venv=str(Path(opts.python).parent.parent), extra=extra)

    def make_context(host: Host) -> HostContext:
        return HostContext(
            host=host, options=options, tier=fleet.tier, scratch=exp.scratch, stack=fleet.stack
        )

    local = run_fleet(
        "verify-gpu",
        fleet.hosts,
        [probe_step, verify_local_step],
        make_context,
        config=config,
        console=console,
        connect_timeout_s=connect_timeout_s,
    )
    verdicts: list[Verdict] = []
    measurements: dict[str, Any] = {}
    for label, m, why in _host_outcomes(local, "verify-node"):
        if m is None:
            verdicts.append(
                Verdict(
                    label,
                    "cpu" if exp.cpu else "gpu",
                    (Check("node", FAIL, "not verified", "-", detail=why),),
                )
            )
            continue
        measurements[label] = {"local": m}
        verdicts.append(judge(m, exp, host=label))
    cluster = None
    if len(fleet.hosts) > 1 and not exp.quick:
        unusable = [v.host for v in verdicts if v.checks and v.checks[0].name in ("node", "report")]
        if unusable:
            cluster = cluster_not_run(
                f"not every node could run the local stage: {', '.join(unusable)}", exp
            )
        else:
            cross = run_fleet(
                "verify-gpu (cross-node)",
                fleet.hosts,
                [verify_cross_step],
                make_context,
                config=config,
                console=console,
                connect_timeout_s=connect_timeout_s,
            )
            per_host: dict[str, dict[str, Any]] = {}
            for label, m, why in _host_outcomes(cross, "verify-cross-node"):
                per_host[label] = m if m is not None else {"report_error": why}
                measurements.setdefault(label, {})["cross"] = per_host[label]
            cluster = judge_cluster(per_host, exp)
    seconds = (dt.datetime.now(dt.UTC) - started).total_seconds()
    return VerifyRun(
        exp, verdicts, cluster, measurements, seconds, started.strftime("%Y-%m-%dT%H:%M:%SZ")
    )


def save_report(run: VerifyRun, reports_dir: Path) -> Path:
    """reports/<stack>/verify-<UTC time>.json (never overwritten: the time is in the name)."""
    folder = reports_dir / (run.expected.stack or "adhoc")
    folder.mkdir(parents=True, exist_ok=True)
    stamp = run.started_at.replace(":", "").replace("-", "")
    path = folder / f"verify-{stamp}.json"
    path.write_text(jsonlib.dumps(run.to_json(), indent=1, default=str) + "\n")
    return path


def upload_report(path: Path, exp: Expected, *, endpoint_url: str | None = None) -> dict[str, Any]:
    """Copy the saved report into the stack's bucket. Returns what happened; never raises."""
    if not exp.bucket:
        return {"status": "skip", "reason": "the stack has no bucket"}
    key = f"gpufleet/verify/{path.name}"
    if exp.provider == "alicloud":
        return _upload_oss(path, exp, key)
    try:
        import boto3
        import botocore.exceptions
    except ImportError:
        return {"status": "skip", "reason": "boto3 is not installed here"}
    session = boto3.session.Session(region_name=exp.region or None)
    if session.get_credentials() is None:
        return {"status": "skip", "reason": "no AWS credentials here (aws configure / AWS_PROFILE)"}
    try:
        session.client("s3", endpoint_url=endpoint_url).upload_file(str(path), exp.bucket, key)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, OSError) as exc:
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    return {"status": "ok", "url": f"s3://{exp.bucket}/{key}"}


def _upload_oss(path: Path, exp: Expected, key: str) -> dict[str, Any]:
    try:
        import oss2
    except ImportError:
        return {
            "status": "skip",
            "reason": "uploading to OSS needs the oss2 package (pip install oss2)",
        }
    key_id = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID")
    secret = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET")
    if not key_id or not secret:
        return {
            "status": "skip",
            "reason": "no ALIBABA_CLOUD_ACCESS_KEY_ID/SECRET in the environment",
        }
    try:
        bucket = oss2.Bucket(
            oss2.Auth(key_id, secret), f"https://oss-{exp.region}.aliyuncs.com", exp.bucket
        )
        bucket.put_object_from_file(key, str(path))
    except Exception as exc:  # oss2 raises its own hierarchy; report, never crash the task
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    return {"status": "ok", "url": f"oss://{exp.bucket}/{key}"}


@fleet_task(
    help={
        **COMMON_HELP,
        "quick": "inventory, health and GEMM only: skip training, bandwidth and scratch tests",
        "cpu": "no GPU needed: run the training step on CPU (gloo, --nproc processes); "
        "reported as a CPU run, never a PASS for a GPU tier",
        "python": f"the node's Python with torch (default {DEFAULT_VENV}/bin/python)",
        "tier": "catalog tier to judge against when hosts come from -H (e.g. a100x8)",
        "nproc": "processes per node in --cpu mode (default 2)",
        "steps": "training steps (default: 30 on GPU, 40 on CPU)",
        "scratch": "scratch path to measure (default: the stack's scratch.path)",
        "scratch_mb": "MiB written and read on scratch (default 4096)",
        "node_env": "extra environment for the node-side run, KEY=VALUE,... "
        "(e.g. NCCL_DEBUG=INFO,NCCL_SOCKET_IFNAME=ens5)",
        "s3_endpoint": "S3-compatible endpoint URL for the bucket probe and the report upload",
        "master_addr": "cross-node rendezvous address (default: the head's private IP)",
        "master_port": "cross-node rendezvous port (default 29512)",
        "timeout": "seconds before a node's benchmark run is killed (default 600)",
        "reports": "folder for the JSON report (default reports/)",
        "upload": "upload the report to the stack's bucket (default on; --no-upload)",
    }
)
def verify_gpu(
    c: Context,
    stack: str = "",
    inventory: str = "",
    json: bool = False,
    quick: bool = False,
    cpu: bool = False,
    python: str = "",
    tier: str = "",
    nproc: int = 2,
    steps: int = 0,
    scratch: str = "",
    scratch_mb: int = 4096,
    node_env: str = "",
    s3_endpoint: str = "",
    master_addr: str = "",
    master_port: int = 29512,
    timeout: float = 600.0,
    reports: str = "reports",
    upload: bool = True,
    connect_timeout: float = 10.0,
) -> None:
    """Prove each node trains at the speed it is paid for: health, GEMM, bandwidth, a DDP step."""
    console = Console(stderr=json, highlight=False, soft_wrap=False)
    fleet = resolve_fleet(c, stack=stack, inventory=inventory)
    outputs = dict(fleet.outputs) or None
    try:
        env = parse_node_env(node_env)
        spec = replace(fleet.scratch, path=scratch) if scratch else None
        exp = expected_from(
            outputs,
            load_catalog(),
            tier=tier or None,
            cpu=cpu,
            quick=quick,
            nodes=len(fleet.hosts),
            scratch=spec or fleet.scratch,
        )
    except ValueError as exc:
        raise Exit(f"gpufleet: {exc}", code=2) from None
    opts = VerifyOptions(
        python=python or f"{DEFAULT_VENV}/bin/python",
        cpu=cpu,
        quick=quick,
        nproc=nproc,
        steps=steps,
        scratch_mb=scratch_mb,
        timeout_s=timeout,
        node_env=env,
        s3_endpoint=s3_endpoint or None,
        master_addr=master_addr or None,
        master_port=master_port,
    )
    quiet = json or os.environ.get("GPUFLEET_QUIET") == "1"
    run = verify_fleet(
        fleet,
        exp,
        opts,
        outputs=outputs,
        config=c.config,
        console=None if quiet else console,
        connect_timeout_s=connect_timeout,
    )
    path = save_report(run, Path(reports))
    uploaded = (
        upload_report(path, exp, endpoint_url=opts.s3_endpoint)
        if upload
        else {"status": "skip", "reason": "--no-upload"}
    )
    doc = run.to_json()
    doc["report_path"] = str(path)
    doc["upload"] = uploaded
    if json:
        print(jsonlib.dumps(doc, indent=1, default=str))
    else:
        for v in run.verdicts:
            console.print(verdict_table(v, f"verify-gpu {v.host}"))
        if run.cluster:
            console.print(
                verdict_table(run.cluster, f"verify-gpu cluster ({len(fleet.hosts)} nodes)")
            )
        console.print(f"report: {path}")
        where = uploaded.get("url") or f"not uploaded ({uploaded.get('reason')})"
        console.print(f"bucket: {where}", highlight=False)
        console.print(
            overall_line([*run.verdicts, *([run.cluster] if run.cluster else [])], run.status),
            style=_STYLE.get(run.status, ""),
            highlight=False,
        )
    if run.status == FAIL:
        raise Exit(code=1)
