"""The offline plan reads like `pulumi preview`: a tree under the stack, in any width and piped."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from infra.plan_view import display_type
from infra.render import jsonable

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "scripts" / "plan.py"
# Alicloud, AWS with EFA, AWS two nodes, Tencent, Azure
STACKS = ("a100x4", "a100x8", "h100x8x2", "tencent-a100x4", "azure-h100x8")
WIDTHS = (80, 200, None)  # None: piped to a file, no COLUMNS
ROW = re.compile(r"^ \+  (?P<branch>(?:[│ ]  )*(?:├─ |└─ )?)(?P<type>\S+)(?:\s+(?P<name>\S+))?$")


@cache
def run(stack: str, width: int | None, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if width is not None:
        env["COLUMNS"] = str(width)
    return subprocess.run(
        [sys.executable, str(PLAN), "--stack", stack, *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


@cache
def planned_json(stack: str) -> dict:
    proc = run(stack, None, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def tree_rows(text: str) -> list[tuple[int, str, str]]:
    """(depth, type, name) of each `+` row; a name wrapped onto the next line is joined."""
    lines = text.splitlines()
    rows = []
    for i, line in enumerate(lines):
        m = ROW.match(line)
        if not m:
            continue
        name = m["name"] or lines[i + 1].strip(" │")
        rows.append((len(m["branch"]) // 3, m["type"], name))
    return rows


cases = pytest.mark.parametrize(
    "stack,width", [(s, w) for s in STACKS for w in WIDTHS], ids=lambda v: str(v)
)


@cases
def test_every_resource_appears_once_under_its_parent(stack: str, width: int | None) -> None:
    proc = run(stack, width)
    assert proc.returncode == 0, proc.stderr
    doc = planned_json(stack)
    rows = tree_rows(proc.stdout)
    assert rows[0] == (0, "pulumi:pulumi:Stack", f"gpufleet-{stack}")
    # rebuild each row's parent from the indentation and compare with --json's urn/parent
    by_urn = {r["urn"]: r for r in doc["resources"]}
    expected = sorted(
        (
            display_type(r["type"]),
            r["name"],
            (display_type(by_urn[r["parent"]]["type"]), by_urn[r["parent"]]["name"])
            if r["parent"] in by_urn
            else ("pulumi:pulumi:Stack", f"gpufleet-{stack}"),
        )
        for r in doc["resources"]
    )
    stack_path: list[tuple[str, str]] = []
    seen = []
    for depth, type_, name in rows:
        del stack_path[depth:]
        if depth:
            seen.append((type_, name, stack_path[-1]))
        stack_path.append((type_, name))
    assert sorted(seen) == expected
    assert f"+ {len(doc['resources']) + 1} to create" in proc.stdout


@cases
def test_no_line_is_wider_than_the_terminal_and_nothing_is_cut(
    stack: str, width: int | None
) -> None:
    text = run(stack, width).stdout
    if width is not None:
        assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text
    for r in planned_json(stack)["resources"]:
        assert display_type(r["type"]) in text and r["name"] in text


def test_piped_output_puts_each_value_on_one_line() -> None:
    text = run("a100x4", None).stdout
    doc = planned_json("a100x4")
    nodes = json.dumps(jsonable(doc["outputs"]["nodes"]), separators=(", ", ": "))
    assert f"    nodes: {nodes}\n" in text
    for warning in doc["cost"]["warnings"]:
        assert f"note: {warning}\n" in text


def test_wrapped_values_keep_every_character_at_80_columns() -> None:
    text = run("a100x4", 80).stdout
    doc = planned_json("a100x4")
    section = text.split("Outputs:\n", 1)[1].split("\n\n", 1)[0]
    joined = re.sub(r"\s+", "", section)
    for key, value in doc["outputs"].items():
        shown = (
            value if isinstance(value, str) else json.dumps(jsonable(value), separators=(",", ":"))
        )
        assert key + ":" + re.sub(r"\s+", "", shown) in joined


def test_the_sections_come_in_preview_order_with_cost_date_and_source() -> None:
    text = run("a100x8", 80).stdout
    cost = planned_json("a100x8")["cost"]
    marks = [text.index(s) for s in ("Previewing update", "Outputs:", "Resources:", "Policies:")]
    assert marks == sorted(marks)
    assert text.index("Hourly cost:") > marks[-1]
    assert f"price of {cost['price_date']}, source: {cost['source']}" in " ".join(text.split())


def test_whole_numbers_stay_whole_in_text_and_json() -> None:
    text = run("a100x8", 200).stdout
    assert re.search(r"fromPort: 22\n", text) and "22.0" not in text
    ssh = next(r for r in planned_json("a100x8")["resources"] if r["name"].endswith("-ssh-0"))
    assert ssh["inputs"]["fromPort"] == 22 and isinstance(ssh["inputs"]["fromPort"], int)
    instance = next(
        r
        for r in planned_json("a100x4")["resources"]
        if r["type"].endswith("ecs/instance:Instance")
    )
    assert type(instance["inputs"]["systemDiskSize"]) is int


def test_json_gives_each_resource_its_urn_and_parent() -> None:
    doc = planned_json("h100x8x2")
    urns = {r["urn"] for r in doc["resources"]}
    assert len(urns) == len(doc["resources"])
    assert all(r["parent"] in urns | {doc["stack_urn"]} for r in doc["resources"])
    components = {r["urn"] for r in doc["resources"] if r["type"].startswith("gpufleet:")}
    assert sum(r["parent"] in components for r in doc["resources"]) > len(components)
    assert "object at 0x" not in json.dumps(doc)  # assets are described, not repr()'d


def test_plan_exits_without_event_loop_noise_on_stderr() -> None:
    proc = run("a10x1", None)
    assert proc.returncode == 0 and proc.stderr == ""
