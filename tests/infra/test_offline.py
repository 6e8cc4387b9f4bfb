"""The offline plan's record: the same stack gives the same document every run."""

from __future__ import annotations

from infra import clouds, offline
from infra.config import StackConfig
from infra.offline import PlanResult


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
