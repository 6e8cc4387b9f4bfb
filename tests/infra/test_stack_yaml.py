"""Stack files are read as the Pulumi CLI (Go's yaml.v3) reads them, and bad ones are refused
before any work: see infra/stack_yaml.py for the sources of each rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra import stack_yaml
from infra.stack_yaml import StackYamlError

STACKS = sorted((Path(__file__).resolve().parents[2] / "stacks").glob("Pulumi.*.yaml"))


@pytest.mark.parametrize("path", STACKS, ids=lambda p: p.name)
def test_every_shipped_stack_file_reads_as_before(path: Path) -> None:
    text = path.read_text()
    assert stack_yaml.load(text) == yaml.safe_load(text)


@pytest.mark.parametrize(
    "text,value",
    [
        ("v: 1:30", "1:30"),  # base 60 in YAML 1.1; yaml.v3: "Base 60 floats are unsupported"
        ("v: on", "on"),
        ("v: yes", "yes"),
        ("v: No", "No"),
        ("v: true", True),
        ("v: FALSE", False),
        ("v: 12", 12),
        ("v: -3", -3),
        ("v: 0x1f", 31),
        ("v: 1.5", 1.5),
        ("v: 1e3", 1000.0),
        ("v: .inf", float("inf")),
        ("v: 203.0.113.0/24", "203.0.113.0/24"),
        ("v: ~", None),
    ],
)
def test_scalars_are_read_as_yaml_v3_reads_them(text: str, value: object) -> None:
    assert stack_yaml.load(text) == {"v": value}


def test_a_key_set_twice_is_refused_with_both_lines_even_when_nested() -> None:
    with pytest.raises(StackYamlError, match=r"line 4: b is set twice \(first at line 3\)"):
        stack_yaml.load("config:\n  tags:\n    b: 1\n    b: 2\n")


def test_merge_keys_and_a_few_aliases_are_fine() -> None:
    doc = stack_yaml.load("base: &b {x: 1}\nmore:\n  <<: *b\n  y: 2\nagain: [*b, *b]\n")
    assert doc["more"] == {"x": 1, "y": 2} and doc["again"] == [{"x": 1}, {"x": 1}]


def test_an_alias_bomb_is_refused_without_building_it() -> None:
    levels = ["l0: &l0 [a, a, a, a, a, a, a, a, a]"] + [
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 12)
    ]
    with pytest.raises(StackYamlError, match="over 10,000 values once its aliases") as err:
        stack_yaml.load("\n".join(levels))  # 9**12 values: this would not return if built
    assert "\n" not in str(err.value) and len(str(err.value)) < 200


def test_an_anchor_that_contains_itself_is_refused() -> None:
    with pytest.raises(StackYamlError, match="contains itself"):
        stack_yaml.load("a: &a [1, *a]\n")


def test_an_oversized_file_is_refused_by_its_size() -> None:
    with pytest.raises(StackYamlError, match="limit 262,144"):
        stack_yaml.load("config: {}\n" + "#" * stack_yaml.MAX_BYTES)


@pytest.mark.parametrize(
    "text,says",
    [
        ("1: x", "the key 1 is read as a number, not text: quote it ('1')"),
        ("true: x", "the key true is read as a boolean"),
        ("? [a]\n: x", "a key must be text"),
    ],
)
def test_a_key_that_is_not_text_is_refused(text: str, says: str) -> None:
    with pytest.raises(StackYamlError) as err:
        stack_yaml.load(text)
    assert str(err.value).startswith("line 1: ") and says in str(err.value)
