"""The offline plan's record: the same stack gives the same document every run."""

from __future__ import annotations

from infra import clouds, offline
from infra.config import StackConfig, load_stack_file
from infra.offline import PLACEHOLDER_SSH_KEY, PlanResult, evaluate
from tests.infra.conftest import STACKS


def test_a_plans_resources_are_in_urn_order_whatever_order_they_registered_in(
    stack: tuple[StackConfig, PlanResult],
) -> None:
    _cfg, result = stack
    urns = [r.urn for r in result.resources]
    assert all(urns)
    assert urns == sorted(urns)


def test_a_plans_invokes_are_in_token_order(stack: tuple[StackConfig, PlanResult]) -> None:
    _cfg, result = stack
    tokens = [token for token, _args in result.invokes]
    assert tokens == sorted(tokens)


def test_every_cloud_with_a_program_answers_the_offline_plan_from_its_own_folder() -> None:
    assert clouds.names("mocks.py") == clouds.names("program.py")
    found = {mod.__name__ for mod in offline.cloud_mocks().values()}
    assert found == {f"infra.clouds.{name}.mocks" for name in clouds.names("program.py")}


def test_each_plan_in_one_process_hangs_under_a_stack_of_its_own() -> None:
    """The tests plan every stack in one process: each run registers its own Stack, and
    its top-level resources hang under it, not under an earlier run's Stack."""
    for name in ("tencent-t4x1", "t4x1", "tencent-t4x1"):
        path = STACKS / f"Pulumi.{name}.yaml"
        result = evaluate(load_stack_file(path, {"sshPublicKey": PLACEHOLDER_SSH_KEY}))
        stack_urn = f"urn:pulumi:{name}::gpufleet::pulumi:pulumi:Stack::gpufleet-{name}"
        assert result.stack_urn == stack_urn
        parents = {r.parent for r in result.resources}
        assert stack_urn in parents
        assert all(p.startswith(f"urn:pulumi:{name}::") for p in parents)
