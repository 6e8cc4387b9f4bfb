"""The cloud's own monitoring agent on the node, where the reaper reads its metrics.

On Tencent the reaper's GPU evidence is QCE/CVM Gpuutil, which only the CVM monitoring agent
reports (infra/clouds/tencent/reaper.py); without it the reaper keeps the node as "unknown" until
the TTL. Which agent, its processes and its documented installer are catalog data
(``[provider.monitoring_agent]``); a cloud without one skips the step. ``fab setup`` runs it
last, so a node whose agent cannot be installed still gets its driver and its watchdog.
"""

from __future__ import annotations

import shlex

from fabric import Connection

from bootstrap.fleet.api import HostContext, StepResult, step
from bootstrap.fleet.system import root_sh, sh
from infra.catalog import MonitoringAgent, load_catalog

INSTALLER_PATH = "/tmp/gpufleet-monitoring-agent-installer"
INSTALL_TIMEOUT_S = 600  # the installer downloads and starts the agent


def agent_for(ctx: HostContext) -> MonitoringAgent | None:
    provider = str(ctx.outputs.get("provider") or "")
    info = load_catalog().providers.get(provider)
    return info.monitoring_agent if info is not None else None


def running_command(process: str) -> str:
    """Whether ``process`` runs: Tencent's own check is ``ps ax | grep <name>``; the
    bracket keeps the check's own command line from matching itself."""
    return f"pgrep -f {shlex.quote(f'[{process[0]}]{process[1:]}')} >/dev/null"


def install_command(agent: MonitoringAgent) -> str:
    """The documented steps (download, make executable, run), bounded in time."""
    path = INSTALLER_PATH
    return (
        f"timeout {INSTALL_TIMEOUT_S} wget -q -O {path} {shlex.quote(agent.installer)} && "
        f"chmod +x {path} && timeout {INSTALL_TIMEOUT_S} {path}; rc=$?; rm -f {path}; exit $rc"
    )


def _missing(conn: Connection, agent: MonitoringAgent) -> list[str]:
    return [p for p in agent.processes if not sh(conn, running_command(p), timeout=30).ok]


@step("monitoring-agent")
def monitoring_agent_step(conn: Connection, ctx: HostContext) -> StepResult:
    agent = agent_for(ctx)
    if agent is None:
        if not ctx.outputs.get("provider"):
            return StepResult.skipped("no stack outputs: the cloud (and its agent) is unknown")
        return StepResult.skipped("this cloud's reaper reads no agent metrics")
    missing = _missing(conn, agent)
    if not missing:
        return StepResult.ok(f"{agent.name} runs", processes=list(agent.processes))
    ctx.progress(f"{', '.join(missing)} not running: installing {agent.name}")
    done = root_sh(conn, ctx, install_command(agent), timeout=INSTALL_TIMEOUT_S * 2 + 60)
    still = _missing(conn, agent)
    if still:
        why = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or [""]
        return StepResult.failed(
            f"{agent.name}: {', '.join(still)} still not running after its installer "
            f"(exit {done.exited}{': ' + why[0][:160] if why[0] else ''}); without it the "
            "reaper keeps this node as unknown until the TTL (install it by hand, source "
            f"{agent.source})",
            missing=still,
        )
    return StepResult.changed(f"{agent.name} installed and running", installed=missing)
