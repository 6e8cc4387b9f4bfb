"""The node health check over SSH: run ``verify_health.py`` in a shipped folder, judge its
snapshot on the laptop (:mod:`bootstrap.verify.health.verdict`) and keep the verdict on the
node (``<state dir>/health/verdict.json``) and in the stack's bucket, both written on the
node by the same file with the node's own bucket client. ``fab health``, ``fab setup`` and
``fab verify-gpu`` all go through :func:`check_node`, so they write one kind of verdict.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fabric import Connection

from bootstrap.fleet import node_package
from bootstrap.fleet.api import HostContext, TierInfo
from bootstrap.fleet.system import sh, sudo_prefix
from bootstrap.verify.expected import Expected
from bootstrap.verify.health.verdict import DEGRADED, FAILED, HealthVerdict, Reason, judge_health
from gpufleet_node.verify_health import DCGM_TIMEOUT_S, STATE_DIR, VERDICT_FILE

# Past this age a verdict no longer lets a node into fab train (docs/verify.md says why).
MAX_AGE_HOURS = 24.0


@dataclass(frozen=True)
class HealthOptions:
    """How the check runs on each node."""

    python: str = "python3"  # verify_health.py is stdlib only
    dcgm_level: int | None = None  # --deep: dcgmi diag -r N
    state_dir: str = str(STATE_DIR)
    node_path: str = ""  # prepended to PATH on the node for the tools (dcgmi elsewhere)
    quarantine: bool = False
    release: bool = False
    s3_endpoint: str = ""
    metadata_url: str = ""


@dataclass(frozen=True)
class HealthExpect:
    """What the tier promises that the verdict holds the node to."""

    gpu_count: int | None = None
    nvlink: bool = False
    nvswitch: bool = False
    infiniband_gbps: float | None = None  # the size's total
    bucket: str | None = None
    provider: str | None = None
    region: str | None = None


def expect_from(exp: Expected | None, tier: TierInfo, outputs: Mapping[str, Any]) -> HealthExpect:
    """From verify's Expected when there is one, else from the stack's tier and outputs."""
    if exp is not None:
        return HealthExpect(
            exp.gpu_count,
            exp.nvlink,
            exp.nvswitch,
            exp.infiniband_gbps,
            exp.bucket,
            exp.provider,
            exp.region,
        )
    return HealthExpect(
        tier.gpu_count,
        False,
        tier.nvswitch,
        None,
        outputs.get("bucket"),
        outputs.get("provider"),
        outputs.get("region"),
    )


def snapshot_command(remote: str, opts: HealthOptions) -> str:
    """Run the snapshot in the shipped folder (pure, so it is tested); ``node_path`` goes
    before the node's own PATH."""
    args = node_package.module_argv(opts.python, remote, "verify_health")
    if opts.dcgm_level:
        args.append(f"--dcgm-level={opts.dcgm_level}")
    run = " ".join(shlex.quote(a) for a in args)
    return f'PATH={shlex.quote(opts.node_path)}:"$PATH" {run}' if opts.node_path else run


def save_command(
    remote: str, verdict: Mapping[str, Any], opts: HealthOptions, hexp: HealthExpect, sudo: str
) -> str:
    """Write the verdict into the shipped folder, then store it as root (the state dir is
    root's, as the watchdog's is) and put it in the bucket. ``--quarantine`` sets aside a
    failed node only; a node that is not failed is never quarantined."""
    blob = base64.b64encode(json.dumps(dict(verdict)).encode()).decode()
    args = [
        # -B: root writes no __pycache__ into the SSH user's shipped folder, which that
        # user's `rm -rf` then could not remove (one folder left in /tmp per run)
        *node_package.module_argv(opts.python, remote, "verify_health", flags=("-B",)),
        f"--save={remote}/verdict.json",
        f"--state-dir={opts.state_dir}",
    ]
    for flag, value in (
        ("bucket", hexp.bucket),
        ("provider", hexp.provider),
        ("region", hexp.region),
        ("s3-endpoint", opts.s3_endpoint),
        ("metadata-url", opts.metadata_url),
    ):
        if value:
            args.append(f"--{flag}={value}")
    failed = verdict.get("status") == FAILED
    args += ["--quarantine"] if opts.quarantine and failed else []
    args += ["--release"] if opts.release else []
    run = " ".join(shlex.quote(a) for a in args)
    return f"printf %s {blob} | base64 -d > {shlex.quote(remote)}/verdict.json && {sudo}{run}"


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def judge_snapshot(
    doc: Mapping[str, Any], host: str, hexp: HealthExpect, load: Iterable[Mapping[str, Any]] = ()
) -> HealthVerdict:
    """The snapshot against the tier; the InfiniBand rate per port is an even share of the
    size's total over the ports the node has."""
    ports = [p for p in doc.get("infiniband") or [] if p.get("link_layer") != "Ethernet"]
    per_port = hexp.infiniband_gbps / len(ports) if hexp.infiniband_gbps and ports else None
    return judge_health(
        doc,
        host,
        nvlink=hexp.nvlink,
        infiniband_gbps_per_port=per_port,
        gpu_count=hexp.gpu_count,
        nvswitch=hexp.nvswitch,
        load=load,
    )


def merged(health: HealthVerdict, other: HealthVerdict | None) -> HealthVerdict:
    """verify-gpu's findings beside the health check's, as one verdict."""
    if other is None:
        return health
    return replace(
        health,
        reasons=(*health.reasons, *other.reasons),
        checked=(*health.checked, *other.checked),
        origin=other.origin,
    )


def take_snapshot(conn: Connection, remote: str, opts: HealthOptions) -> dict[str, Any]:
    """The node's snapshot, or {"error": why} when it could not be read."""
    limit = 240.0 + (DCGM_TIMEOUT_S[opts.dcgm_level] if opts.dcgm_level else 0.0)
    out = sh(conn, snapshot_command(remote, opts), timeout=limit)
    text = str(out.stdout)
    try:
        doc = json.loads(text[text.find("{") :]) if "{" in text else None
    except ValueError:
        doc = None
    if not out.ok or not isinstance(doc, dict):
        tail = " | ".join((str(out.stderr) or text).strip().splitlines()[-3:])
        return {"error": f"verify_health.py failed (exit {out.exited}): {tail or 'no output'}"}
    return doc


def check_node(
    conn: Connection,
    ctx: HostContext,
    remote: str,
    opts: HealthOptions,
    hexp: HealthExpect,
    *,
    other: HealthVerdict | None = None,
    load: Iterable[Mapping[str, Any]] = (),
) -> tuple[HealthVerdict, dict[str, Any]]:
    """Snapshot, judge, store. Returns the verdict and what storing it did (the node's file,
    the bucket's answer, the seconds the snapshot's tools took)."""
    ctx.progress(
        "health snapshot" + (f" with dcgmi diag -r {opts.dcgm_level}" if opts.dcgm_level else "")
    )
    doc = take_snapshot(conn, remote, opts)
    if "error" in doc:
        verdict = HealthVerdict(
            ctx.host.label,
            now_utc(),
            (Reason("snapshot", DEGRADED, doc["error"], "re-run fab health"),),
        )
    else:
        verdict = judge_snapshot(doc, ctx.host.label, hexp, load)
    verdict = merged(verdict, other)
    saved = sh(
        conn, save_command(remote, verdict.to_json(), opts, hexp, sudo_prefix(ctx)), timeout=120
    )
    try:
        stored: dict[str, Any] = json.loads(str(saved.stdout).strip().splitlines()[-1])
    except (ValueError, IndexError):
        why = " | ".join((str(saved.stderr) or str(saved.stdout)).strip().splitlines()[-2:])
        stored = {"error": f"verdict not stored (exit {saved.exited}): {why or 'no output'}"}
    stored["timings"] = doc.get("timings") or {}
    return verdict, stored


def verdict_path(state_dir: str) -> str:
    return f"{state_dir.rstrip('/')}/{VERDICT_FILE}"


def age_hours(taken_at: str, now: dt.datetime | None = None) -> float | None:
    """How old a verdict is, or None when its time cannot be read."""
    try:
        taken = dt.datetime.fromisoformat(taken_at.replace("Z", "+00:00"))
    except ValueError:
        return None
    if taken.tzinfo is None:
        taken = taken.replace(tzinfo=dt.UTC)
    return ((now or dt.datetime.now(dt.UTC)) - taken).total_seconds() / 3600


def format_age(hours: float | None) -> str:
    if hours is None:
        return "?"
    if hours < 1:
        return f"{max(0, int(hours * 60))}m"
    return f"{hours:.0f}h" if hours < 48 else f"{hours / 24:.0f}d"
