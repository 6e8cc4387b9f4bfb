"""The offline plan's record: the same stack gives the same document every run."""

from __future__ import annotations

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
