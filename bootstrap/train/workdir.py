"""Which files of a laptop workdir ``fab train`` copies to the nodes, and how.

Git decides inside a work tree (tracked and untracked, minus ignored); elsewhere the
.gitignore files are read (the subset of gitignore(5) a workdir needs). The manifest
({path: [size, sha256]}) is compared with the one the node kept from the last sync, so a
rerun sends only what changed. Pure functions: nothing here touches a node.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json as jsonlib
import subprocess
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bootstrap.train.spec import TrainError
from infra.render import wrap, wrap_prose

SYNC_MANIFEST = ".gpufleet-sync.json"
PLAN_MEMBER = ".gpufleet-plan.json"


def git_files(root: Path) -> list[str] | None:
    """Files git would keep under ``root`` (tracked + untracked, minus ignored), or None
    when ``root`` is not inside a git work tree (or git is missing)."""
    try:
        done = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    names = [n for n in done.stdout.decode(errors="surrogateescape").split("\0") if n]
    return sorted(n for n in names if (root / n).is_file() and not (root / n).is_symlink())


@dataclass(frozen=True)
class IgnoreRule:
    pattern: str
    negate: bool
    dir_only: bool
    anchored: bool
    base: str  # the folder (relative to the workdir) whose .gitignore holds the rule


def parse_gitignore(text: str, base: str = "") -> list[IgnoreRule]:
    """The subset of gitignore(5) that matters for a workdir: globs, ``!`` negation, a
    trailing ``/`` for folders, a leading or inner ``/`` anchoring, ``**``."""
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        if line.startswith("\\"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        rules.append(IgnoreRule(line.lstrip("/"), negate, dir_only, anchored, base))
    return rules


def _rule_matches(rule: IgnoreRule, rel: str, is_dir: bool) -> bool:
    if rule.dir_only and not is_dir:
        return False
    if rule.base:
        if not rel.startswith(rule.base + "/"):
            return False
        rel = rel[len(rule.base) + 1 :]
    if rule.anchored:
        pattern = rule.pattern
        if fnmatch.fnmatchcase(rel, pattern):
            return True
        return "**" in pattern and fnmatch.fnmatchcase(rel, pattern.replace("**/", ""))
    return fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], rule.pattern)


def is_ignored(rules: Sequence[IgnoreRule], rel: str, is_dir: bool) -> bool:
    ignored = False
    for rule in rules:  # the last matching rule decides, as in git
        if _rule_matches(rule, rel, is_dir):
            ignored = not rule.negate
    return ignored


def walk_files(root: Path) -> list[str]:
    """Files under ``root`` without git: .gitignore files honoured, .git never entered."""
    return _walk(root)[0]


def _walk(root: Path) -> tuple[list[str], list[str]]:
    """One walk of ``root`` without git, .gitignore files honoured, .git and links never
    entered: (the files kept, what .gitignore keeps back: files, and folders with a "/")."""
    kept: list[str] = []
    ignored: list[str] = []
    rules: list[IgnoreRule] = []

    def visit(folder: Path, rel_folder: str) -> None:
        gi = folder / ".gitignore"
        if gi.is_file():
            rules.extend(parse_gitignore(gi.read_text(errors="replace"), rel_folder))
        for entry in sorted(folder.iterdir(), key=lambda p: p.name):
            rel = f"{rel_folder}/{entry.name}" if rel_folder else entry.name
            if entry.name == ".git" or entry.is_symlink():
                continue
            if entry.is_dir():
                if is_ignored(rules, rel, True):
                    ignored.append(rel + "/")
                else:
                    visit(entry, rel)
            elif entry.is_file():
                (ignored if is_ignored(rules, rel, False) else kept).append(rel)

    visit(root, "")
    return kept, ignored


def workdir_files(root: Path) -> list[str]:
    files = git_files(root)
    if files is None:
        files = walk_files(root)
    return [f for f in files if ".git" not in Path(f).parts and f != SYNC_MANIFEST]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_manifest(root: Path, files: Iterable[str], limit_bytes: float) -> dict[str, list[Any]]:
    """{relative path: [size, sha256]}; a TrainError when the total is over the limit."""
    sizes = {f: (root / f).stat().st_size for f in files}
    total = sum(sizes.values())
    if total > limit_bytes:
        biggest = sorted(sizes, key=lambda f: -sizes[f])[:3]
        top = ", ".join(f"{f} ({sizes[f] / 1e6:.1f} MB)" for f in biggest)
        raise TrainError(
            f"workdir {root} holds {total / 1e6:.1f} MB to copy, over the "
            f"{limit_bytes / 1e6:.0f} MB limit (largest: {top}); list data and checkpoints "
            "in .gitignore (read them from the bucket instead), or raise --max-workdir-mb"
        )
    return {f: [sizes[f], sha256_file(root / f)] for f in sorted(sizes)}


def diff_manifest(
    local: Mapping[str, Sequence[Any]], remote: Mapping[str, Sequence[Any]]
) -> tuple[list[str], list[str]]:
    """(files to send, files to delete): only what changed since the last sync; a file is
    deleted on the node only if an earlier sync put it there and the laptop no longer has it."""
    send = sorted(f for f, entry in local.items() if list(remote.get(f) or []) != list(entry))
    delete = sorted(f for f in remote if f not in local)
    return send, delete


def pack(root: Path, names: Sequence[str], plan: Mapping[str, Any]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in names:
            tar.add(str(root / name), arcname=name, recursive=False)
        data = jsonlib.dumps(plan).encode()
        info = tarfile.TarInfo(PLAN_MEMBER)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# Kept back by .gitignore, and never what a job reads: not worth naming.
_NOISE_NAMES = {"__pycache__", ".DS_Store", ".ipynb_checkpoints", ".git", ".mypy_cache"}
_NOISE_SUFFIXES = (".pyc", ".pyo")


def _noise(root: Path, rel: str) -> bool:
    parts = rel.rstrip("/").split("/")
    if any(p in _NOISE_NAMES for p in parts) or rel.endswith(_NOISE_SUFFIXES):
        return True
    # A virtualenv (or its files): the nodes have their own (--venv).
    return any((root.joinpath(*parts[: i + 1]) / "pyvenv.cfg").is_file() for i in range(len(parts)))


def _git_kept_back(root: Path) -> list[str] | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--others", "--ignored",
             "--exclude-standard", "--directory"],
            capture_output=True,
            timeout=60,
            check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [n for n in done.stdout.decode(errors="surrogateescape").split("\0") if n]


def _walk_kept_back(root: Path) -> list[str]:
    return _walk(root)[1]


@dataclass(frozen=True)
class KeptBack:
    """What .gitignore keeps from the nodes: files (biggest first) and whole folders."""

    files: tuple[tuple[str, int], ...]
    folders: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.files) + len(self.folders)

    def lines(self, width: int, shown: int = 3) -> list[str]:
        """The note train-start prints: count, the first few paths, and `fab data-push`;
        each line at most ``width`` columns."""
        if not self.count:
            return []
        size = sum(s for _, s in self.files) / 1e6
        what = f"{len(self.files)} file(s) ({size:.1f} MB)" if self.files else ""
        if self.folders:
            what += (" and " if what else "") + f"{len(self.folders)} folder(s)"
        names = [f"{p} ({s / 1e6:.1f} MB)" for p, s in self.files] + list(self.folders)
        listed = [ln for name in names[:shown] for ln in wrap(name, width, "  ", "    ")]
        if len(names) > shown:
            listed.append(f"  and {len(names) - shown} more")
        first = self.files[0][0] if self.files else self.folders[0]
        folder = str(Path(first.rstrip("/")).parent) if self.files else first.rstrip("/")
        push = f"fab data-push {folder}" if folder not in ("", ".") else "fab data-push FOLDER"
        return [
            *wrap(f"gpufleet: .gitignore kept {what} from the nodes:", width),
            *listed,
            *wrap_prose(
                f"a job that reads them needs them on the node: `{push}` puts a folder "
                "in every node's scratch, read there as {scratch}/data/NAME "
                "(docs/data.md)",
                width,
                "  ",
            ),
        ]


def kept_back(root: Path) -> KeptBack:
    """The files and folders of ``root`` that .gitignore keeps from the nodes (git decides
    inside a work tree, else the .gitignore files), less caches and virtualenvs."""
    names = _git_kept_back(root)
    if names is None:
        names = _walk_kept_back(root)
    files, folders = [], []
    for rel in names:
        if _noise(root, rel):
            continue
        if rel.endswith("/"):
            folders.append(rel)
        elif (root / rel).is_file() and not (root / rel).is_symlink():
            files.append((rel, (root / rel).stat().st_size))
    files.sort(key=lambda f: (-f[1], f[0]))
    return KeptBack(tuple(files), tuple(sorted(folders)))
