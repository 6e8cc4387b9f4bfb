"""The node package (``gpufleet_node/``) as fab ships it, and how a node runs one of its tools.

A node runs a tool as a module, ``python3 -m gpufleet_node.<tool>``, with the folder fab
shipped into first on PYTHONPATH. What is shipped keeps the package's layout
(``<dir>/gpufleet_node/...``) and holds the tool's import closure within the package
(:func:`closure`): the whole package, gzipped and in base64, is 158 KB, more than Linux lets
one command line argument carry (128 KiB), and fab train ships its runner inside the command
that runs it (one round trip).
"""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

import gpufleet_node

PACKAGE = gpufleet_node.__name__
PACKAGE_DIR = Path(gpufleet_node.__file__).resolve().parent


def _module_file(dotted: str) -> Path | None:
    """The file of ``gpufleet_node.a.b`` (a module or a package's __init__), or None."""
    base = PACKAGE_DIR.joinpath(*dotted.split(".")[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _dotted(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([PACKAGE, *parts])


def _package_of(path: Path) -> str:
    dotted = _dotted(path)
    return dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]


def _imports(path: Path) -> set[Path]:
    """The package files ``path`` imports (relative imports, anywhere in the file); a
    subpackage's ``__init__`` every module beside it (clouds/ imports its folder)."""
    found: set[Path] = set()
    here = _package_of(path).split(".")
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        anchor = ".".join(here[: len(here) - node.level + 1])
        base = f"{anchor}.{node.module}" if node.module else anchor
        for target in (base, *(f"{base}.{alias.name}" for alias in node.names)):
            file = _module_file(target)
            if file is not None:
                found.add(file)
    if path.name == "__init__.py" and path.parent != PACKAGE_DIR:
        found.update(p for p in path.parent.glob("*.py") if p != path)
    return found


def closure(*tools: str) -> list[str]:
    """The package files (paths under the shipped folder: ``gpufleet_node/...``) that
    ``python3 -m gpufleet_node.<tool>`` needs for each of ``tools``: the tool, what it
    imports within the package, transitively, and the ``__init__.py`` of every package on
    the way."""
    todo = [PACKAGE_DIR / f"{tool.replace('.', '/')}.py" for tool in tools]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        if not path.is_file():
            raise FileNotFoundError(f"{path} is not a module of {PACKAGE}")
        seen.add(path)
        todo += _imports(path)
        parent = path.parent
        while parent != PACKAGE_DIR.parent:
            todo.append(parent / "__init__.py")
            parent = parent.parent
    return sorted(f"{PACKAGE}/{p.relative_to(PACKAGE_DIR).as_posix()}" for p in seen)


def source(name: str) -> Path:
    """The file here of ``name`` (a path under the shipped folder, ``gpufleet_node/...``)."""
    return PACKAGE_DIR.parent / name


def module_command(root: str, tool: str, *, keep_pythonpath: bool = False) -> str:
    """``python3 -m gpufleet_node.<tool>`` for a shell, ``root`` (the folder the package was
    shipped into) first on PYTHONPATH, quoted; ``keep_pythonpath``: the caller's own
    PYTHONPATH after it (a job's interpreter keeps what the user set)."""
    path = shlex.quote(root) + ("${PYTHONPATH:+:$PYTHONPATH}" if keep_pythonpath else "")
    return f"PYTHONPATH={path} python3 -m {PACKAGE}.{tool}"


def module_argv(
    python: str,
    root: str,
    tool: str,
    *,
    flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> list[str]:
    """``env PYTHONPATH=<root> [VAR=value...] <python> [FLAGS] -m gpufleet_node.<tool>`` as
    argv words (for shlex.join; ``env`` makes it survive a ``sudo`` before it); a
    PYTHONPATH in ``env`` goes after ``root``."""
    extra = dict(env or {})
    path = ":".join(p for p in (root, extra.pop("PYTHONPATH", "")) if p)
    assignments = [f"PYTHONPATH={path}", *(f"{k}={v}" for k, v in extra.items())]
    return ["env", *assignments, python, *flags, "-m", f"{PACKAGE}.{tool}"]
