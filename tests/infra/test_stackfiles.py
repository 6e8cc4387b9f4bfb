"""Stack name <-> file and "did you mean" exist once, and every command uses them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from infra.stackfiles import StackNotFound, find_stack, stack_file, stack_name, stack_names
from infra.suggest import did_you_mean

ROOT = Path(__file__).resolve().parents[2]


def test_a_stack_name_and_its_file_round_trip(tmp_path: Path):
    path = stack_file("a100x4", tmp_path)
    assert path == tmp_path / "Pulumi.a100x4.yaml"
    assert stack_name(path) == "a100x4"
    assert stack_name(tmp_path / "Pulumi.yaml") is None  # the project file is not a stack
    assert stack_name(tmp_path / "notes.yaml") is None


def test_known_stacks_are_the_stack_files_only_sorted(tmp_path: Path):
    for name in ("b", "a"):
        stack_file(name, tmp_path).write_text("config: {}\n")
    (tmp_path / "Pulumi.yaml").write_text("name: x\n")
    (tmp_path / "Pulumi.dir.yaml").mkdir()
    assert stack_names(tmp_path) == ["a", "b"]


def test_a_missing_stack_names_the_close_one_and_all_known(tmp_path: Path):
    for name in ("a100x4", "t4x1"):
        stack_file(name, tmp_path).write_text("config: {}\n")
    with pytest.raises(StackNotFound) as err:
        find_stack("a100x3", tmp_path)
    assert "(did you mean 'a100x4'?)" in str(err.value)
    assert str(err.value).endswith("Known stacks: a100x4, t4x1; or pass --stack-file FILE")


def test_an_empty_stack_name_is_not_the_folder(tmp_path: Path):
    with pytest.raises(StackNotFound, match="no stack ''"):
        find_stack("", tmp_path)


def test_did_you_mean_is_empty_when_nothing_is_close():
    assert did_you_mean("zzzz", ["aws", "alicloud"]) == ""
    assert did_you_mean("alicluod", ["aws", "alicloud"]) == " (did you mean 'alicloud'?)"


def _offenders(pattern_call: str) -> list[str]:
    found = []
    for folder in ("infra", "scripts", "bootstrap", "policy"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name in ("suggest.py", "stackfiles.py"):
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr == pattern_call:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                if isinstance(node, ast.Constant) and node.value == "Pulumi.*.yaml":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_nothing_else_computes_close_matches_or_globs_stack_files():
    assert _offenders("get_close_matches") == []


def test_a_command_without_stack_file_can_leave_that_way_out(tmp_path: Path):
    stack_file("a100x4", tmp_path).write_text("config: {}\n")
    with pytest.raises(StackNotFound) as err:
        find_stack("a100x3", tmp_path, otherwise="")
    assert str(err.value).endswith("Known stacks: a100x4")
