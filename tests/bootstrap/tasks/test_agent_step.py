"""The monitoring-agent step's exact remote commands on Fabric's mocked SSH session
(MockRemote): on Tencent it checks the CVM monitoring agent's processes and runs Tencent's
documented installer when one is missing (cloud.tencent.com/document/product/248/6211, as
tencentyun/qcloud-documents gives it: wget the installer, chmod +x, run it; it works when
sgagent and barad_agent run); a cloud whose reaper reads no agent skips it."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from fabric import Connection
from fabric.testing.base import Command, MockRemote
from fabric.testing.fixtures import remote  # noqa: F401  (the pytest fixture)

from bootstrap.fleet.api import Host, HostContext, Options, StepResult, TierInfo
from bootstrap.fleet.runner import run_step
from bootstrap.tasks.agent import monitoring_agent_step
from bootstrap.tasks.setup import setup_steps
from infra.catalog import load_catalog

SGAGENT = "pgrep -f '[s]gagent' >/dev/null"
BARAD = "pgrep -f '[b]arad_agent' >/dev/null"
INSTALLER = "http://update2.agent.tencentyun.com/update/linux_stargate_installer"
TMP = "/tmp/gpufleet-monitoring-agent-installer"
INSTALL = (
    f"timeout 600 wget -q -O {TMP} {INSTALLER} && chmod +x {TMP} && timeout 600 {TMP}; "
    f"rc=$?; rm -f {TMP}; exit $rc"
)


def run_agent_step(
    mock: MockRemote, commands: Sequence[Command], provider: str = "tencent"
) -> StepResult:
    mock.expect(host="node", user="ubuntu", commands=list(commands))
    ctx = HostContext(
        host=Host("node", user="ubuntu"),
        options=Options(),
        tier=TierInfo(name="a100x4", gpu_model="A100-40GB", gpu_count=4),
        outputs={"provider": provider},
        facts={"uid": 1000},
    )
    conn = Connection("node", user="ubuntu")
    try:
        return run_step(monitoring_agent_step, conn, ctx)
    finally:
        conn.close()


def test_the_agent_is_tencents_documented_one() -> None:
    agent = load_catalog().providers["tencent"].monitoring_agent
    assert agent is not None
    assert agent.processes == ("sgagent", "barad_agent")
    assert agent.installer == INSTALLER
    assert load_catalog().providers["aws"].monitoring_agent is None


def test_a_running_agent_is_left_alone(remote: MockRemote) -> None:  # noqa: F811
    result = run_agent_step(remote, [Command(SGAGENT), Command(BARAD)])
    assert result.status.value == "ok"


def test_a_missing_agent_is_installed_as_tencent_documents_then_checked_again(
    remote: MockRemote,  # noqa: F811
) -> None:
    result = run_agent_step(
        remote,
        [
            Command(SGAGENT, exit=1),
            Command(BARAD, exit=1),
            Command(f"sudo -n sh -c {shlex.quote(INSTALL)}"),
            Command(SGAGENT),
            Command(BARAD),
        ],
    )
    assert result.status.value == "changed"
    assert result.details["installed"] == ["sgagent", "barad_agent"]


def test_an_agent_that_will_not_start_fails_the_step_and_says_what_it_costs(
    remote: MockRemote,  # noqa: F811
) -> None:
    result = run_agent_step(
        remote,
        [
            Command(SGAGENT),
            Command(BARAD, exit=1),
            Command(
                f"sudo -n sh -c {shlex.quote(INSTALL)}", exit=4, err=b"wget: unable to resolve"
            ),
            Command(SGAGENT),
            Command(BARAD, exit=1),
        ],
    )
    assert result.is_failure
    assert "barad_agent still not running" in result.message
    assert "unknown until the TTL" in result.message and "wget: unable" in result.message


def test_a_cloud_whose_reaper_reads_no_agent_skips_the_step(remote: MockRemote) -> None:  # noqa: F811
    result = run_agent_step(remote, [], provider="aws")
    assert result.status.value == "skipped"


def test_setup_runs_the_agent_step_after_the_installs_and_the_health_check_last() -> None:
    from bootstrap.tasks.health import health_step

    assert setup_steps()[-2:] == [monitoring_agent_step, health_step]
