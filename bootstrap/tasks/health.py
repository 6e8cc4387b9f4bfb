"""``fab health``: each node's health verdict (healthy / degraded / failed), kept on the node
and in the stack's bucket; fast by default (nvidia-smi, the kernel log, InfiniBand),
``--deep N`` adds NVIDIA's ``dcgmi diag -r N``. ``fab setup`` ends with the same step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fabric import Connection
from invoke import Context
from rich.text import Text

from bootstrap.fleet.api import HostContext, Options, StepResult, step
from bootstrap.fleet.cli import FleetArgs, fleet_run, fleet_task
from bootstrap.fleet.numbers import Bound
from bootstrap.fleet.runner import FleetReport, summary_table
from bootstrap.verify.health.check import HealthOptions, check_node, expect_from
from bootstrap.verify.health.verdict import FAILED, NOTE, HealthVerdict
from bootstrap.verify.replace import instance_urns, replace_command
from bootstrap.verify.ship import note_cleanup, remove, ship
from infra.render import output_width, wrap_prose

STYLE = {"healthy": "bold green", "degraded": "bold yellow", "failed": "bold red"}


def verdict_message(v: HealthVerdict, seconds: float) -> str:
    worst = [r for r in v.reasons if r.level == v.status and r.level != NOTE]
    why = (
        f": {worst[0].check}" + (f" (+{len(worst) - 1})" if len(worst) > 1 else "") if worst else ""
    )
    return f"verdict {v.status}{why} ({seconds:.1f} s)"


@step("health")
def health_step(conn: Connection, ctx: HostContext) -> StepResult:
    """The node's health snapshot, judged and stored."""
    opts = ctx.options.of(HealthOptions) or HealthOptions()
    hexp = expect_from(None, ctx.tier, ctx.outputs)
    remote = ship(conn)
    try:
        verdict, stored = check_node(conn, ctx, remote, opts, hexp)
    finally:
        cleanup_error = remove(conn, remote)
    note_cleanup(ctx, stored, cleanup_error)
    seconds = sum(stored.get("timings", {}).values())
    details = {
        "verdict": verdict.to_json(),
        "stored": stored,
        "seconds": round(seconds, 2),
        "stack": ctx.stack,
    }
    message = verdict_message(verdict, seconds)
    if "error" in stored:
        return StepResult.failed(f"{message}; {stored['error']}", **details)
    if verdict.status == FAILED:
        return StepResult.failed(message, **details)
    return StepResult.ok(message, **details)


def less(width: int | None, n: int) -> int | None:
    return None if width is None else width - n


def health_text(v: dict[str, Any], stored: dict[str, Any], width: int | None) -> Text:
    """One line per node with its verdict, its reasons beneath, one per line."""
    text = Text()
    text.append(f"{v['status'].upper():<9}", style=STYLE.get(v["status"], ""))
    text.append(f" {v['host']}  taken {v['taken_at']}\n")
    for r in v["reasons"]:
        where = f"GPU{r['gpu']} " if r.get("gpu") is not None else ""
        line = f"[{r['level']}] {r['check']}: {where}{r['text']}"
        for part in wrap_prose(line, less(width, 4)):
            text.append(f"    {part}\n")
        if r.get("action") and r["level"] != NOTE:
            for part in wrap_prose(f"-> {r['action']}", less(width, 6)):
                text.append(f"      {part}\n")
    bucket = stored.get("bucket") or {}
    kept = bucket.get("url") or f"not in the bucket ({bucket.get('reason', '?')})"
    lines = [f"kept: {stored.get('file', '?')}; {kept}"]
    if stored.get("quarantine"):
        lines.append(f"quarantine: {stored['quarantine']}")
    for line in lines:
        for part in wrap_prose(line, less(width, 4)):
            text.append(f"    {part}\n")
    return text


def failed_nodes(report: FleetReport) -> list[str]:
    """The stack's node names whose verdict is failed."""
    out = []
    for h in report.hosts:
        rec = next((s for s in h.steps if s.name == "health"), None)
        v = rec.result.details.get("verdict") if rec else None
        if v and v["status"] == FAILED and h.host.name:
            out.append(h.host.name)
    return out


def replace_lines(stack: str | None, names: list[str]) -> list[str]:
    """The exact command that replaces each failed node, or why it cannot be given."""
    if not names:
        return []
    if not stack:
        return ["replace: hosts came from -H, not a stack: no Pulumi URN to replace"]
    try:
        urns = instance_urns(stack, names)
    except ValueError as exc:
        return [f"replace: {exc}"]
    return [
        f"replace {n}: `{replace_command(stack, urns[n])}`" if n in urns else f"replace {n}: no URN"
        for n in names
    ]


def render_health(report: FleetReport) -> Iterable[Any]:
    width = output_width()
    stack = None
    for h in report.hosts:
        rec = next((s for s in h.steps if s.name == "health"), None)
        if rec is None or "verdict" not in rec.result.details:
            continue
        stack = stack or rec.result.details.get("stack")
        yield health_text(rec.result.details["verdict"], rec.result.details["stored"], width)
    for line in replace_lines(stack, failed_nodes(report)):
        yield Text("\n".join(wrap_prose(line, width)))
    if any(
        h.connection_error or not any(s.name == "health" for s in h.steps) for h in report.hosts
    ):
        yield summary_table(report)


_HEALTH = HealthOptions()  # its defaults, written once; the task's signature reads them


@fleet_task(
    help={
        "deep": "also run NVIDIA's dcgmi diag at this level: 1 (about a minute), 2 (a few "
        "minutes), 3 (half an hour on 8 GPUs); needs DCGM (fab setup installs it)",
        "state_dir": f"the node's gpufleet state folder (default {_HEALTH.state_dir})",
        "node_path": "folders put before PATH on the node for nvidia-smi, dcgmi, ibstat",
        "quarantine": "set failed nodes aside: fab train and the node's watchdog leave "
        "them alone until they are replaced (or --release)",
        "release": "lift a quarantine set with --quarantine",
        "s3_endpoint": "bucket API URL override for the verdict's copy (tests, MinIO)",
        "metadata_url": "metadata service override on the node (tests)",
    },
    bounds={"deep": Bound(0, high=3, example="2")},
)
def health(
    c: Context,
    fleet_args: FleetArgs,
    deep: int = 0,
    state_dir: str = _HEALTH.state_dir,
    node_path: str = "",
    quarantine: bool = False,
    release: bool = False,
    s3_endpoint: str = "",
    metadata_url: str = "",
) -> None:
    """Each node's health verdict, kept on the node and in the bucket; --deep N runs DCGM."""
    opts = HealthOptions(
        dcgm_level=deep or None,
        state_dir=state_dir,
        node_path=node_path,
        quarantine=quarantine,
        release=release,
        s3_endpoint=s3_endpoint,
        metadata_url=metadata_url,
    )
    fleet_run(
        c,
        "health",
        [health_step],
        fleet_args,
        options=Options(tasks=(opts,)),
        readonly=True,
        render=render_health,
    )
