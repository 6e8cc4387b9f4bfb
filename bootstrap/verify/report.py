"""What one ``fab verify-gpu`` produced (:class:`VerifyRun`), saved as JSON under reports/ and
copied into the stack's bucket from the head node (the node's own bucket client)."""

from __future__ import annotations

import json as jsonlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabric import Connection

from bootstrap.fleet.api import Host, HostContext, Options, StepResult, step
from bootstrap.fleet.runner import run_fleet
from bootstrap.verify.expected import Expected
from bootstrap.verify.ship import VerifyInputs, VerifyOptions, upload_on_node
from bootstrap.verify.verdict import Verdict, overall

REPORT_SCHEMA = "gpufleet.verify-report/1"


@dataclass
class VerifyRun:
    """Everything one ``fab verify-gpu`` produced."""

    expected: Expected
    verdicts: list[Verdict]
    cluster: Verdict | None
    measurements: dict[str, Any]
    seconds: float
    started_at: str
    # The fabric and the environment the cross-node stage ran with (None: no cross-node run).
    network: Mapping[str, Any] | None = None

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
            "network": dict(self.network) if self.network is not None else None,
            "measurements": self.measurements,
        }


def save_report(run: VerifyRun, reports_dir: Path) -> Path:
    """reports/<stack>/verify-<UTC time>.json (never overwritten: the time is in the name)."""
    folder = reports_dir / (run.expected.stack or "adhoc")
    folder.mkdir(parents=True, exist_ok=True)
    stamp = run.started_at.replace(":", "").replace("-", "")
    path = folder / f"verify-{stamp}.json"
    path.write_text(jsonlib.dumps(run.to_json(), indent=1, default=str) + "\n")
    return path


@step("verify-upload")
def upload_step(conn: Connection, ctx: HostContext) -> StepResult:
    """Copy the saved report into the stack's bucket from this node."""
    report = ctx.options.need(VerifyInputs).report
    if report is None:
        raise TypeError("verify-upload needs VerifyInputs.report")
    result = upload_on_node(conn, ctx, report)
    return StepResult.ok(str(result.get("status")), upload=result)


def upload_report(
    path: Path,
    exp: Expected,
    opts: VerifyOptions,
    head: Host,
    *,
    config: Any = None,
    connect_timeout_s: float = 10.0,
) -> dict[str, Any]:
    """Copy the saved report into the stack's bucket from the head node, with the node's
    own bucket client (gpufleet_node/bucket.py) and identity: the client and the
    credentials the watchdog, job sync and the storage probe use, so this machine needs
    no bucket credentials of any cloud. Returns what happened; never raises."""
    if not exp.bucket:
        return {"status": "skip", "reason": "the stack has no bucket"}
    options = Options(tasks=(VerifyInputs(opts, exp, report=path),))
    done = run_fleet(
        "verify-gpu (report upload)",
        [head],
        [upload_step],
        lambda host: HostContext(host=host, options=options, scratch=exp.scratch),
        config=config,
        connect_timeout_s=connect_timeout_s,
    )
    (host,) = done.hosts
    if host.connection_error:
        return {"status": "error", "reason": host.connection_message}
    rec = next((s for s in host.steps if s.name == upload_step.step_name), None)
    if rec is None or "upload" not in rec.result.details:
        return {"status": "error", "reason": rec.result.message if rec else "not run"}
    return dict(rec.result.details["upload"])
