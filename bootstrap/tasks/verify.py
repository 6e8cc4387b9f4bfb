"""``fab verify-gpu``: prove that each node trains at the speed it is paid for.

The node side (``gpufleet_node/verify_node.py`` and friends) measures and returns raw
numbers as JSON; :mod:`bootstrap.verify.judge` decides, purely, against the catalog, with the
checks in :mod:`bootstrap.verify.checks`. This module holds the two steps (``verify-node``,
``verify-cross-node``), runs them on every node (and across nodes) and is the ``verify-gpu``
task: render the verdicts, save and upload the report.
"""

from __future__ import annotations

import datetime as dt
import json as jsonlib
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from fabric import Connection
from invoke import Context
from invoke.exceptions import Exit
from rich.console import Console

from bootstrap.fleet.api import Host, HostContext, Options, StepResult, step
from bootstrap.fleet.cli import FleetArgs, fleet_task, resolve_fleet
from bootstrap.fleet.hosts import Fleet
from bootstrap.fleet.interconnect import fabric_env
from bootstrap.fleet.numbers import Bound
from bootstrap.fleet.runner import FleetReport, run_fleet
from bootstrap.fleet.system import probe_step
from bootstrap.verify.expected import Expected, expected_from
from bootstrap.verify.health.check import HealthOptions, check_node, expect_from, now_utc
from bootstrap.verify.health.verdict import from_verify
from bootstrap.verify.judge import cluster_not_run, judge, judge_cluster
from bootstrap.verify.report import VerifyRun, save_report, upload_report
from bootstrap.verify.ship import VerifyInputs, VerifyOptions, parse_node_env, run_on_node
from bootstrap.verify.verdict import FAIL, Check, Verdict
from bootstrap.verify.verdict_text import STYLE, overall_line, verdict_text
from infra.catalog import load_catalog
from infra.render import output_width


def _result(measurements: dict[str, Any], ctx: HostContext, cluster: bool = False) -> StepResult:
    exp = ctx.options.need(VerifyInputs).expected
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
def verify_node_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Inventory, health and the benchmarks on one node; the node's health verdict (the
    health snapshot with verify's findings) is kept as fab health keeps it."""
    opts = ctx.options.of(HealthOptions)  # verify_fleet sets it
    kept: dict[str, Any] = {}

    def keep_verdict(remote: str, measurements: dict[str, Any]) -> None:
        assert opts is not None
        exp = ctx.options.need(VerifyInputs).expected
        found = from_verify(judge(measurements, exp, host=ctx.host.label), now_utc())
        load = (measurements.get("load") or {}).get("gpus") or []
        verdict, stored = check_node(
            conn, ctx, remote, opts, expect_from(exp, ctx.tier, ctx.outputs), other=found, load=load
        )
        kept.update(verdict=verdict.to_json(), stored=stored)

    measurements = run_on_node(conn, ctx, "local", after=keep_verdict if opts else None)
    if kept:
        measurements["health_verdict"] = kept
    return _result(measurements, ctx)


@step("verify-cross-node")
def verify_cross_node_step(conn: Connection, ctx: HostContext) -> StepResult:
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
    health: HealthOptions | None = None,
) -> VerifyRun:
    """Run the local stage on every host in parallel, then (several hosts, not --quick) the
    cross-node stage on all of them at once, and judge everything."""
    started = dt.datetime.now(dt.UTC)
    ranks = {h: i for i, h in enumerate(fleet.hosts)}
    if len(ranks) != len(fleet.hosts):
        raise ValueError("the same host is listed twice")
    given = VerifyInputs(
        opts, exp, ranks=ranks, master_addr=master_address(outputs, fleet, opts.master_addr)
    )
    options = Options(
        venv=str(Path(opts.python).parent.parent),
        tasks=(given, health or HealthOptions(python=opts.python)),
    )

    def make_context(host: Host) -> HostContext:
        return HostContext(
            host=host, options=options, tier=fleet.tier, scratch=exp.scratch, stack=fleet.stack
        )

    local = run_fleet(
        "verify-gpu",
        fleet.hosts,
        [probe_step, verify_node_step],
        make_context,
        config=config,
        console=console,
        connect_timeout_s=connect_timeout_s,
    )
    verdicts: list[Verdict] = []
    measurements: dict[str, Any] = {}
    for label, m, why in _host_outcomes(local, verify_node_step.step_name):
        if m is None:
            not_verified = Check("node", FAIL, "not verified", "-", detail=why)
            verdicts.append(Verdict(label, "cpu" if exp.cpu else "gpu", (not_verified,)))
            continue
        measurements[label] = {"local": m}
        verdicts.append(judge(m, exp, host=label))
    cluster = None
    network = None
    if len(fleet.hosts) > 1 and not exp.quick:
        unusable = [v.host for v in verdicts if v.checks and v.checks[0].name in ("node", "report")]
        if unusable:
            cluster = cluster_not_run(
                f"not every node could run the local stage: {', '.join(unusable)}", exp
            )
        else:
            network = {
                **opts.fabric.to_json(),
                "user_env": dict(opts.node_env),
                "applied": opts.stage_env("cross"),
            }
            cross = run_fleet(
                "verify-gpu (cross-node)",
                fleet.hosts,
                [verify_cross_node_step],
                make_context,
                config=config,
                console=console,
                connect_timeout_s=connect_timeout_s,
            )
            per_host: dict[str, dict[str, Any]] = {}
            for label, m, why in _host_outcomes(cross, verify_cross_node_step.step_name):
                per_host[label] = m if m is not None else {"report_error": why}
                measurements.setdefault(label, {})["cross"] = per_host[label]
            cluster = judge_cluster(per_host, exp)
    seconds = (dt.datetime.now(dt.UTC) - started).total_seconds()
    return VerifyRun(
        exp,
        verdicts,
        cluster,
        measurements,
        seconds,
        started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        network,
    )


# The options' defaults, written once (in VerifyOptions and HealthOptions): the task's
# signature and help read them from here.
_VERIFY = VerifyOptions()
_HEALTH = HealthOptions()


@fleet_task(
    help={
        "quick": "inventory, health and GEMM only: skip training, bandwidth and scratch tests",
        "cpu": "no GPU needed: run the training step on CPU (gloo, --nproc processes); "
        "reported as a CPU run, never a PASS for a GPU tier",
        "python": f"the node's Python with torch (default {_VERIFY.python})",
        "tier": "catalog tier to judge against when hosts come from -H (e.g. a100x8)",
        "nproc": f"processes per node in --cpu mode (default {_VERIFY.nproc})",
        "steps": "training steps (default: 30 on GPU, 40 on CPU)",
        "scratch": "scratch path to measure (default: the stack's scratch.path)",
        "scratch_mb": f"MiB written and read on scratch (default {_VERIFY.scratch_mb})",
        "node_env": "extra environment for the node-side run, KEY=VALUE,... "
        "(e.g. NCCL_DEBUG=INFO,NCCL_SOCKET_IFNAME=ens5); over the cross-node run's "
        "EFA/InfiniBand defaults, which it always beats",
        "s3_endpoint": "S3-compatible endpoint URL for the bucket probe and the report upload",
        "master_addr": "cross-node rendezvous address (default: the head's private IP)",
        "master_port": f"cross-node rendezvous port (default {_VERIFY.master_port})",
        "timeout": "seconds before a node's benchmark run is killed "
        f"(default {_VERIFY.timeout_s:g})",
        "reports": "folder for the JSON report (default reports/)",
        "upload": "upload the report to the stack's bucket (default on; --no-upload)",
        "state_dir": "the node's gpufleet state folder, where the health verdict is kept "
        f"(default {_HEALTH.state_dir})",
    },
    bounds={
        "nproc": Bound(1, example=str(_VERIFY.nproc)),
        "steps": Bound(1, example="30"),
        "scratch_mb": Bound(1, example=str(_VERIFY.scratch_mb)),
        "master_port": Bound(1, high=65535, example=str(_VERIFY.master_port)),
        "timeout": Bound(0, above=True, example=f"{_VERIFY.timeout_s:g}"),
    },
)
def verify_gpu(
    c: Context,
    fleet_args: FleetArgs,
    quick: bool = False,
    cpu: bool = False,
    python: str = "",
    tier: str = "",
    nproc: int = _VERIFY.nproc,
    steps: int = 0,
    scratch: str = "",
    scratch_mb: int = _VERIFY.scratch_mb,
    node_env: str = "",
    s3_endpoint: str = "",
    master_addr: str = "",
    master_port: int = _VERIFY.master_port,
    timeout: float = _VERIFY.timeout_s,
    reports: str = "reports",
    upload: bool = True,
    state_dir: str = _HEALTH.state_dir,
) -> None:
    """Prove each node trains at the speed it is paid for: health, GEMM, bandwidth, a DDP step."""
    json = fleet_args.json
    console = Console(stderr=json, highlight=False, soft_wrap=False)
    fleet = resolve_fleet(c, fleet_args)
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
        python=python or _VERIFY.python,
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
        fabric=fabric_env(dict((outputs or {}).get("tier") or {}), fleet.provider),
    )
    quiet = json or os.environ.get("GPUFLEET_QUIET") == "1"
    run = verify_fleet(
        fleet,
        exp,
        opts,
        outputs=outputs,
        config=c.config,
        console=None if quiet else console,
        connect_timeout_s=fleet_args.connect_timeout,
        health=HealthOptions(python=opts.python, state_dir=state_dir, s3_endpoint=s3_endpoint),
    )
    path = save_report(run, Path(reports))
    uploaded = (
        upload_report(
            path,
            exp,
            opts,
            fleet.hosts[0],
            config=c.config,
            connect_timeout_s=fleet_args.connect_timeout,
        )
        if upload
        else {"status": "skip", "reason": "--no-upload"}
    )
    if json:
        doc = {**run.to_json(), "report_path": str(path), "upload": uploaded}
        print(jsonlib.dumps(doc, indent=1, default=str))
    else:
        print_run(console, run, opts, path, uploaded)
    if run.status == FAIL:
        raise Exit(code=1)


def print_run(
    console: Console, run: VerifyRun, opts: VerifyOptions, path: Path, uploaded: Mapping[str, Any]
) -> None:
    """The verdicts laid out for the terminal's width (none when piped): rich must not
    wrap them again."""
    width = output_width()
    for v in run.verdicts:
        console.print(verdict_text(v, f"verify-gpu {v.host}", width), soft_wrap=True)
    if run.cluster:
        title = f"verify-gpu cluster ({len(run.verdicts)} nodes)"
        console.print(verdict_text(run.cluster, title, width), soft_wrap=True)
    if run.network is not None:
        console.print(f"cross-node env: {opts.fabric.describe()}", highlight=False)
        if opts.node_env:
            user = " ".join(f"{k}={v}" for k, v in opts.node_env.items())
            console.print(f"  --node-env over it: {user}", highlight=False)
    for line in health_lines(run):
        console.print(line, highlight=False)
    console.print(f"report: {path}")
    where = uploaded.get("url") or f"not uploaded ({uploaded.get('reason')})"
    console.print(f"bucket: {where}", highlight=False)
    console.print(
        overall_line([*run.verdicts, *([run.cluster] if run.cluster else [])], run.status),
        style=STYLE.get(run.status, ""),
        highlight=False,
    )


def health_lines(run: VerifyRun) -> list[str]:
    """Per node, the health verdict verify-gpu kept and where."""
    out = []
    for host, m in run.measurements.items():
        kept = (m.get("local") or {}).get("health_verdict")
        if not kept:
            continue
        stored = kept["stored"]
        where = stored.get("error") or stored.get("file")
        out.append(f"health {host}: {kept['verdict']['status']}, kept in {where}")
    return out
