"""The README and the docs/ pages it links to tell the truth about stacks, config keys and
commands."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.config import KEYS
from tests.infra.conftest import STACK_FILES, planned, stack_id

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The stacks table lives on the stacks page, the keys table on the configuration page.
STACKS_DOC = (ROOT / "docs" / "stacks.md").read_text()
CONFIG_DOC = (ROOT / "docs" / "configuration.md").read_text()
TESTING_DOC = (ROOT / "docs" / "testing.md").read_text()
GUARDS_DOC = (ROOT / "docs" / "guards.md").read_text()


def stack_rows() -> dict[str, list[str]]:
    section = STACKS_DOC.split("## The shipped stacks", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] not in ("stack", "---"):
            rows[cells[0]] = cells
    return rows


def shipped_stack_files() -> list[Path]:
    """The stack files this repository ships (tracked by git): a stack a user adds to stacks/
    needs no row in docs/stacks.md and no test change, as that page promises."""
    try:
        done = subprocess.run(
            ["git", "ls-files", "stacks/Pulumi.*.yaml"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return STACK_FILES
    tracked = {ROOT / line for line in done.stdout.split()}
    return [p for p in STACK_FILES if p in tracked] if done.returncode == 0 else STACK_FILES


SHIPPED = shipped_stack_files()


def test_every_shipped_stack_file_has_a_row_and_every_row_a_stack_file():
    assert {stack_id(p) for p in SHIPPED} <= set(stack_rows()) <= {stack_id(p) for p in STACK_FILES}


@pytest.mark.parametrize("path", SHIPPED, ids=stack_id)
def test_stack_rows_match_what_the_program_declares(path):
    cfg, result = planned(path)
    _, provider, itype, gpus, nodes, billing, price = stack_rows()[stack_id(path)]
    tier = result.outputs["tier"]
    assert (provider, itype, int(nodes), billing) == (
        cfg.provider,
        tier["instance_type"],
        cfg.nodes,
        cfg.billing,
    )
    assert gpus.startswith(f"{tier['gpu_count']}x ")
    cost = result.outputs["hourly_cost"]
    numbers = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", price)]
    expected = cost["low"] if "low" in cost else cost["amount"]
    assert numbers[0] == pytest.approx(expected, abs=0.01)
    assert cost["currency"] in price


def test_every_config_key_is_documented():
    for key in KEYS:
        assert f"| `{key}` |" in CONFIG_DOC, key


def test_the_two_commands_are_there_and_exist_in_the_makefile():
    makefile = (ROOT / "Makefile").read_text()
    assert "make plan STACK=a100x4" in README and "make test" in README
    assert re.search(r"^plan:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_stays_a_short_entry_point():
    """About 250 lines (issue 23): the reference lives in docs/, one page per topic."""
    assert len(README.splitlines()) <= 250


def shipped_clouds() -> set[str]:
    """The clouds the shipped stacks run on, read from the stack files themselves."""
    return {yaml.safe_load(p.read_text())["config"]["gpufleet:provider"] for p in SHIPPED}


PROOF_SECTION = "## What is proven here, and what only a real account can prove"


@pytest.mark.parametrize("cloud", sorted(shipped_clouds()))
def test_every_cloud_has_one_page_with_one_proof_section_and_a_summary_row(cloud):
    page = ROOT / "docs" / "clouds" / f"{cloud}.md"
    assert page.is_file(), f"{cloud} ships a stack but has no docs/clouds/{cloud}.md"
    assert page.read_text().count(PROOF_SECTION) == 1
    link = f"[clouds/{cloud}.md](clouds/{cloud}.md)"
    summary = TESTING_DOC.split("## Per cloud: what is proven", 1)[1]
    assert link in summary, "docs/testing.md's per-cloud summary table lacks its row"
    assert link in GUARDS_DOC.split("\n## ", 1)[0], "the guards page's table lacks its column"
    assert f"(docs/clouds/{cloud}.md)" in README


SECURITY = (ROOT / "SECURITY.md").read_text()


def security_sections() -> dict[str, list[str]]:
    """Each top-level section of SECURITY.md with its subsection headings."""
    sections: dict[str, list[str]] = {}
    current = ""
    for line in SECURITY.splitlines():
        if line.startswith("## "):
            current = line[3:]
            sections[current] = []
        elif line.startswith("### ") and current:
            sections[current].append(line[4:])
    return sections


def test_security_names_each_cloud_once_per_topic():
    for title, subsections in security_sections().items():
        assert len(subsections) == len(set(subsections)), title


@pytest.mark.parametrize("cloud", sorted(shipped_clouds()))
def test_security_has_each_cloud_in_each_per_cloud_topic(cloud):
    heading = (ROOT / "docs" / "clouds" / f"{cloud}.md").read_text().splitlines()[0]
    name = heading.removeprefix("# ").split(" (", 1)[0]
    per_cloud = [t for t, subs in security_sections().items() if "per cloud" in t]
    per_cloud.append(next(t for t in security_sections() if t.startswith("11. ")))
    assert len(per_cloud) == 3
    for title in per_cloud:
        assert name in security_sections()[title], f"SECURITY.md '{title}' lacks {name}"
