"""fab train honours the node's health verdict, over the real sshd: a fake nvidia-smi on the
node's PATH (``fab health --node-path``) prints a recorded nvidia-smi -q -x, fab health
keeps the verdict in the state folder (the jobs folder's parent), and fab train reads it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.bootstrap.conftest import FabResult, run_fab
from tests.bootstrap.tasks.test_health_ssh import fake_tools
from tests.bootstrap.tasks.test_train_ssh import (  # noqa: F401  (fixtures)
    TrainFleet,
    moto_url,
    one_node,
    place,
)

pytestmark = pytest.mark.integration


def health(fleet: TrainFleet, tools: Path) -> FabResult:
    done = run_fab(
        "health", "--inventory", str(fleet.inventory), "--state-dir", str(fleet.jobs.parent),
        "--node-path", str(tools),
    )  # fmt: skip
    # The verdict is stored as root (sudo here): the shipped folder must still go away.
    assert "could not remove" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


def train(fleet: TrainFleet, *extra: str) -> FabResult:
    argv = [a if a != "2" else "1" for a in fleet.train("--steps 2 --ckpt-every 2")]
    return run_fab(*argv, "--follow", *extra, timeout=400)


def record(fleet: TrainFleet, result: FabResult) -> dict[str, object]:
    job = re.search(r"job (\S+) running on 1 node", result.stdout)
    assert job, result.stdout[-2000:] + result.stderr[-2000:]
    spec: dict[str, object] = json.loads((fleet.jobs / job.group(1) / "job.json").read_text())
    return spec


@pytest.mark.slow
def test_a_failed_node_is_refused_the_override_is_recorded_and_a_healthy_verdict_lets_it_in(
    one_node: TrainFleet,  # noqa: F811
) -> None:
    folder = one_node.jobs.parent
    bad = health(one_node, fake_tools(folder / "bad", "a100x8_smi_ecc.xml"))
    assert bad.returncode == 1 and "FAILED" in bad.stdout, bad.stdout + bad.stderr

    refused = train(one_node)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    (line,) = [ln for ln in refused.stderr.splitlines() if "health verdict" in ln]
    assert "health verdict failed 0m ago (ecc: 2 volatile uncorrectable ECC error(s))" in line
    assert line.endswith("re-check with `fab health`, or pass --ignore-health to train anyway")
    assert "1 of 1 node(s) not ready: nothing started" in refused.stderr
    assert not list(one_node.jobs.glob("*/job.json"))

    forced = train(one_node, "--ignore-health")
    assert forced.returncode == 0, forced.stdout[-2000:] + forced.stderr[-2000:]
    (kept,) = dict(record(one_node, forced)["health"]).values()  # type: ignore[call-overload]
    assert kept["status"] == "failed" and "health verdict failed" in kept["override"]

    good = health(one_node, fake_tools(folder / "good", "a100x8_smi.xml"))
    assert good.returncode == 0 and "HEALTHY" in good.stdout, good.stdout + good.stderr
    again = train(one_node)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    (kept,) = dict(record(one_node, again)["health"]).values()  # type: ignore[call-overload]
    assert kept["status"] == "healthy" and "override" not in kept
