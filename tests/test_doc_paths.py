"""Every file of this repository that the docs, the catalog and the code's comments point at
exists: a path left behind by a move (bootstrap/verify.py became bootstrap/verify/ and
bootstrap/tasks/verify.py) sends the reader nowhere."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = (
    "infra", "bootstrap", "scripts", "policy", "tests", "stacks", "examples", "docs",
    "gpufleet_node",
)  # fmt: skip
# A path into one of the top folders, naming a file by its ending (placeholders such as
# Pulumi.<stack>.yaml, Pulumi.NAME.yaml or verify_*.py included).
MENTION = re.compile(
    rf"(?<![\w./-])((?:{'|'.join(TOP)})/[\w./<>*{{}}-]*\.(?:py|toml|yaml|yml|md|json|sh|txt))\b"
)
PLACEHOLDER = re.compile(r"<[^>]*>|\{[^}]*\}|\b[A-Z]{2,}\b")
# Where the mentions are read: the docs, and the shipped code and data (tests name missing
# files on purpose, to see them refused).
READ = (
    "README.md", "SECURITY.md", "Makefile", "docs", "infra", "bootstrap", "scripts", "policy",
    "gpufleet_node",
)  # fmt: skip
ENDINGS = (".py", ".toml", ".md", ".yaml", ".yml", ".sh", ".txt")


def tracked_files(root: Path) -> list[str]:
    try:
        done = subprocess.run(
            ["git", "ls-files"], cwd=root, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        done = None
    if done is None or done.returncode != 0:  # an unpacked copy without git
        return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
    return done.stdout.splitlines()


def mentioned_paths(text: str) -> list[str]:
    """The repository paths a text names, placeholders turned into wildcards."""
    return [PLACEHOLDER.sub("*", m.group(1)) for m in MENTION.finditer(text)]


def missing_mentions(root: Path, names: list[str] | None = None) -> list[str]:
    """`file:line: path` for each path the files `names` (default: the tracked ones) name
    that matches no file under `root`."""
    missing = []
    for name in tracked_files(root) if names is None else names:
        if not (name in READ or name.startswith(tuple(f"{d}/" for d in READ))):
            continue
        if name not in READ and not name.endswith(ENDINGS):
            continue
        path = root / name
        if not path.is_file():  # tracked but deleted in this working tree
            continue
        for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for mention in mentioned_paths(line):
                if not any(root.glob(mention)):
                    missing.append(f"{name}:{line_no}: {mention}")
    return missing


# A Markdown link to a file of this repository, relative to the page: [text](../guards.md).
LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)#\s]+)(?:#[^)]*)?\)")


def broken_links(root: Path, names: list[str]) -> list[str]:
    """`file:line: target` for each relative Markdown link in the pages `names` that leads
    to no file (links resolve against the page's own folder, as GitHub renders them)."""
    broken = []
    for name in names:
        page = root / name
        for line_no, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for match in LINK.finditer(line):
                if not (page.parent / match.group(1)).exists():
                    broken.append(f"{name}:{line_no}: {match.group(1)}")
    return broken


def doc_pages(root: Path) -> list[str]:
    pages = sorted(str(p.relative_to(root)) for p in (root / "docs").rglob("*.md"))
    return ["README.md", "SECURITY.md", *pages]


def test_mentions_are_found_with_placeholders_as_wildcards():
    text = (
        "see bootstrap/verify.py, `infra/config.py`; stacks/Pulumi.<stack>.yaml and "
        "stacks/Pulumi.NAME.yaml, gpufleet_node/verify_*.py, not /opt/infra/x.py or "
        "myinfra/y.py"
    )
    assert mentioned_paths(text) == [
        "bootstrap/verify.py",
        "infra/config.py",
        "stacks/Pulumi.*.yaml",
        "stacks/Pulumi.*.yaml",
        "gpufleet_node/verify_*.py",
    ]


def test_a_moved_file_is_reported_where_it_is_still_named(tmp_path: Path):
    (tmp_path / "bootstrap" / "verify").mkdir(parents=True)
    (tmp_path / "bootstrap" / "verify" / "judge.py").write_text('"""bootstrap/verify/judge.py"""\n')
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.a100x4.yaml").write_text("config: {}\n")
    (tmp_path / "README.md").write_text(
        "Edit stacks/Pulumi.<stack>.yaml.\nThe checks: bootstrap/verify.py reads them.\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text('"tests/nope.py"\n')  # tests are not read
    names = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()]
    assert missing_mentions(tmp_path, names) == ["README.md:2: bootstrap/verify.py"]


def test_every_repository_path_the_docs_and_code_name_exists():
    assert missing_mentions(ROOT) == []


def test_a_link_is_resolved_against_its_own_page(tmp_path: Path):
    (tmp_path / "docs" / "clouds").mkdir(parents=True)
    (tmp_path / "docs" / "guards.md").write_text("# Guards\n")
    (tmp_path / "docs" / "clouds" / "aws.md").write_text(
        "[ok](../guards.md), [anchor](../guards.md#rules), [web](https://example.com/x.md)\n"
        "[wrong](guards.md)\n"
    )
    assert broken_links(tmp_path, ["docs/clouds/aws.md"]) == ["docs/clouds/aws.md:2: guards.md"]


def test_every_link_between_the_docs_leads_to_a_file():
    assert broken_links(ROOT, doc_pages(ROOT)) == []


def test_the_readme_links_to_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {m.group(1) for m in LINK.finditer(readme)}
    pages = [name for name in doc_pages(ROOT) if name.startswith("docs/")]
    assert pages and [name for name in pages if name not in linked] == []
