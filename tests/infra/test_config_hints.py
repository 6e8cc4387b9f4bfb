"""Config mistakes a newcomer makes get a message that leads to a plan that passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.config import ConfigError, load_stack_file


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "Pulumi.hint.yaml"
    path.write_text("config:\n" + body)
    return path


def test_a_key_without_the_gpufleet_prefix_gets_the_key_to_write(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "  tier: t4x1\n  gpufleet:provider: aws\n  gpufleet:sshCidrs: ['203.0.113.0/24']\n",
    )
    with pytest.raises(ConfigError) as err:
        load_stack_file(path)
    assert (
        err.value.problems[0] == "tier: config keys need the gpufleet: prefix: write gpufleet:tier"
    )


def test_a_prefix_hint_is_given_even_when_the_rest_is_valid(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "  billing: spot\n  gpufleet:provider: aws\n  gpufleet:tier: t4x1\n"
        "  gpufleet:sshCidrs: ['203.0.113.0/24']\n",
    )
    with pytest.raises(ConfigError) as err:
        load_stack_file(path)
    assert err.value.problems == [
        "billing: config keys need the gpufleet: prefix: write gpufleet:billing"
    ]


def test_other_namespaces_are_still_accepted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "  aws:region: us-east-1\n  gpufleet:provider: aws\n  gpufleet:tier: t4x1\n"
        "  gpufleet:sshCidrs: ['203.0.113.0/24']\n",
    )
    assert load_stack_file(path).tier == "t4x1"


def test_the_world_ssh_message_says_the_policy_still_refuses_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "  gpufleet:provider: aws\n  gpufleet:tier: t4x1\n  gpufleet:sshCidrs: ['0.0.0.0/0']\n",
    )
    with pytest.raises(ConfigError) as err:
        load_stack_file(path)
    message = " ".join(err.value.problems)
    assert "203.0.113.7/32" in message and "ssh-not-open-to-world still refuses" in message
