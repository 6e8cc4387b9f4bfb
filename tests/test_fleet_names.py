"""One source for the tag and metric names: gpufleet_node/fleet_names.py. The node runs it in
its package, the reaper and the stack import it from there, the reaper's function zip packs
it under the same import path, and no other code in infra/, bootstrap/, policy/, scripts/ or
the node package spells a tag key or a metric name out: an AST scan of every string literal
(docstrings, README and docs may still name them) fails when one does."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from gpufleet_node import fleet_names
from infra.reaper import tags
from infra.reaper.handler import PACKAGE, build_function_zip

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("infra", "bootstrap", "policy", "scripts", "gpufleet_node")
SOURCE = ROOT / "gpufleet_node" / "fleet_names.py"
NODE_PACKAGE = "gpufleet_node"  # its import path, in the repository and in the function zip

# Metric names and the managed-by key are plain words: only a literal that IS one counts.
WHOLE = frozenset({*fleet_names.METRIC_NAMES, fleet_names.MANAGED_BY})
# "gpufleet:" keys count inside longer text too ("protected (gpufleet:protected=true)"),
# unless a key character or ":" follows: "gpufleet:tier: a100x1" is the stack's config key
# of the same name in a Pulumi.<stack>.yaml line, not the tag.
PREFIXED = tuple(k for k in fleet_names.TAG_KEYS if k.startswith("gpufleet:"))
_KEY = re.compile("|".join(re.escape(k) for k in sorted(PREFIXED, key=len, reverse=True)))


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, name) for every tag key or metric name written out in a string literal."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        if id(node) in docs:
            continue
        text = node.value
        if text in WHOLE:
            hits.append((node.lineno, text))
        for m in _KEY.finditer(text):
            after = text[m.end() : m.end() + 1]
            if after and (after.isalnum() or after in "-_:"):
                continue  # a longer key, or a config key ("gpufleet:tier: ...")
            hits.append((node.lineno, m.group()))
    return sorted(hits)


def test_the_scan_finds_names_in_literals_and_f_strings_but_not_in_docstrings() -> None:
    source = "\n".join(
        [
            '"""Reads gpufleet:protected and Heartbeat."""',  # 1: the module docstring
            'KEY = "gpufleet:keep-alive-until"',  # 2
            'reason = f"protected (gpufleet:protected={v})"',  # 3: inside an f-string
            'metric = "UnsyncedCheckpointFiles"',  # 4
            'label = "Watchdog heartbeat"',  # 5: prose, not the name
            'yaml = f"  gpufleet:tier: {tier}"',  # 6: the config key of the same name
            'other = "gpufleet:sshPublicKey"',  # 7: a config key, no tag
            'reserved = key == "managed-by"',  # 8
            "def f():",  # 9
            '    """Sets gpufleet:ttl-hours."""',  # 10: a docstring
            '    return "gpufleet:ttl-hours" + "GPUUtilization"',  # 11: two names
        ]
    )
    assert spelled_names(source) == [
        (2, "gpufleet:keep-alive-until"),
        (3, "gpufleet:protected"),
        (4, "UnsyncedCheckpointFiles"),
        (8, "managed-by"),
        (11, "GPUUtilization"),
        (11, "gpufleet:ttl-hours"),
    ]


def test_no_code_outside_fleet_names_spells_a_tag_key_or_a_metric_name() -> None:
    exempt = {SOURCE.resolve()}
    found = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.resolve() in exempt:  # the module itself
                continue
            hits = spelled_names(path.read_text(encoding="utf-8"))
            if hits:
                found[path.relative_to(ROOT).as_posix()] = hits
    assert found == {}, (
        "tag keys and metric names come from gpufleet_node/fleet_names.py (or "
        f"infra.reaper.tags): {found}"
    )


def test_the_names_file_has_one_home_and_no_symlink_is_tracked() -> None:
    assert Path(fleet_names.__file__).resolve() == SOURCE.resolve()
    assert tags.PROTECTED is fleet_names.PROTECTED
    staged = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert [line for line in staged.splitlines() if line.startswith("120000")] == []


def test_infra_reaper_tags_reexports_every_tag_of_fleet_names() -> None:
    assert set(tags.__all__) >= {
        name for name, value in vars(fleet_names).items() if value in fleet_names.TAG_KEYS
    }
    assert (tags.PROTECTED, tags.KEEP_ALIVE_UNTIL) == (
        fleet_names.PROTECTED,
        fleet_names.KEEP_ALIVE_UNTIL,
    )
    assert len(set(fleet_names.TAG_KEYS)) == len(fleet_names.TAG_KEYS)


def test_fleet_names_imports_nothing() -> None:
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def test_every_layer_reads_the_protected_tag_the_same_way() -> None:
    yes = [" True", "YES", "1", "on", "maybe", None, 1]  # unknown values are honoured too
    no = ["", "false", " Off ", "no", "0"]
    assert all(fleet_names.is_protected(v) for v in yes)
    assert not any(fleet_names.is_protected(v) for v in no)


def test_the_function_zip_packs_fleet_names_and_imports_it_in_a_clean_interpreter(
    tmp_path: Path,
) -> None:
    archive = zipfile.ZipFile(io.BytesIO(build_function_zip(provider="aws")))
    packed = archive.read(f"{NODE_PACKAGE}/fleet_names.py")
    assert packed == SOURCE.read_bytes()
    archive.extractall(tmp_path / "fn")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        f"import {PACKAGE}.tags as t, {NODE_PACKAGE}.idle_rules as p, "
        f"{NODE_PACKAGE}.fleet_names as n\n"
        "assert t.PROTECTED is n.PROTECTED and p.names is n\n"
        "import importlib.util; assert importlib.util.find_spec('infra') is None\n"
        "print(n.__file__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-E", "-I", "-c", code, str(tmp_path / "fn")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == tmp_path / "fn" / NODE_PACKAGE / "fleet_names.py"
