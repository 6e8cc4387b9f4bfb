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
from gpufleet_node import clouds

PACKAGE = gpufleet_node.__name__
PACKAGE_DIR = Path(gpufleet_node.__file__).resolve().parent


def files() -> dict[str, Path]:
    """Every file the package ships (its path under the shipped folder, ``gpufleet_node/...``)
    and its file here: the package's own modules, and each cloud's node module, written in
    the cloud's folder (infra/clouds/<name>/node.py) and shipped as ``clouds/<name>.py``
    (:func:`gpufleet_node.clouds.sources`)."""
    found = {
        f"{PACKAGE}/{p.relative_to(PACKAGE_DIR).as_posix()}": p
        for p in sorted(PACKAGE_DIR.rglob("*.py"))
        if "__pycache__" not in p.parts
    }
    folder = "/".join(clouds.__name__.split("."))
    for name, path in clouds.sources().items():
        found.setdefault(f"{folder}/{name}.py", path)
    return found


def source(name: str) -> Path:
    """The file here of ``name`` (a path under the shipped folder, ``gpufleet_node/...``)."""
    return files().get(name) or PACKAGE_DIR.parent / name


def _module_file(dotted: str, shipped: dict[str, Path]) -> str | None:
    """The shipped name of ``gpufleet_node.a.b`` (a module or a package's __init__), or None."""
    base = dotted.replace(".", "/")
    for candidate in (f"{base}.py", f"{base}/__init__.py"):
        if candidate in shipped:
            return candidate
    return None


def _package_of(name: str) -> str:
    dotted = name.removesuffix(".py").replace("/", ".")
    return (
        dotted.removesuffix(".__init__")
        if name.endswith("/__init__.py")
        else (dotted.rpartition(".")[0])
    )


def _imports(name: str, shipped: dict[str, Path]) -> set[str]:
    """The package files ``name`` imports (relative imports, and the absolute ones of the
    package a cloud's node module makes, anywhere in the file); a subpackage's ``__init__``
    every module shipped beside it (clouds/ imports its folder)."""
    found: set[str] = set()
    here = _package_of(name).split(".")
    for node in ast.walk(ast.parse(shipped[name].read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.level:
            anchor = ".".join(here[: len(here) - node.level + 1])
            base = f"{anchor}.{node.module}" if node.module else anchor
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == PACKAGE:
            base = str(node.module)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.split(".")[0] == PACKAGE]
        found.update(f for t in targets if (f := _module_file(t, shipped)) is not None)
    folder = name.rpartition("/")[0]
    if name.endswith("/__init__.py") and folder != PACKAGE:
        found.update(n for n in shipped if n.rpartition("/")[0] == folder and n != name)
    return found


def closure(*tools: str) -> list[str]:
    """The package files (paths under the shipped folder: ``gpufleet_node/...``) that
    ``python3 -m gpufleet_node.<tool>`` needs for each of ``tools``: the tool, what it
    imports within the package, transitively, and the ``__init__.py`` of every package on
    the way."""
    shipped = files()
    todo = [f"{PACKAGE}/{tool.replace('.', '/')}.py" for tool in tools]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        if name not in shipped:
            raise FileNotFoundError(f"{source(name)} is not a module of {PACKAGE}")
        seen.add(name)
        todo += _imports(name, shipped)
        parts = name.split("/")[:-1]
        todo += ["/".join([*parts[:i], "__init__.py"]) for i in range(1, len(parts) + 1)]
    return sorted(seen)


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
