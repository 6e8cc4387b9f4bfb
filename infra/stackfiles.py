"""Stack name <-> stack file, in one place: ``stacks/Pulumi.<name>.yaml``.

plan, cost, size and the benchmarks all find, list and write stack files through here, so a
missing stack gets the same message (with a suggestion and the known names) everywhere.
"""

from __future__ import annotations

from pathlib import Path

from infra.suggest import did_you_mean

STACKS_DIR = Path(__file__).resolve().parent.parent / "stacks"
_PREFIX, _SUFFIX = "Pulumi.", ".yaml"


class StackNotFound(LookupError):
    """No file for the stack name; the message names the close one and the known ones."""


def stack_file(name: str, stacks_dir: Path | None = None) -> Path:
    """Where the stack ``name``'s file is (or would be written)."""
    return (stacks_dir or STACKS_DIR) / f"{_PREFIX}{name}{_SUFFIX}"


def stack_name(path: Path) -> str | None:
    """``Pulumi.a100x4.yaml`` -> ``a100x4``; None for a file that is not a stack file."""
    name = path.name
    if name.startswith(_PREFIX) and name.endswith(_SUFFIX) and len(name) > 12:
        return name[len(_PREFIX) : -len(_SUFFIX)]
    return None


def stack_names(stacks_dir: Path | None = None) -> list[str]:
    """The stacks that have a file, sorted."""
    folder = stacks_dir or STACKS_DIR
    found = (stack_name(p) for p in folder.glob(f"{_PREFIX}*{_SUFFIX}") if p.is_file())
    return sorted(n for n in found if n)


def find_stack(
    name: str, stacks_dir: Path | None = None, otherwise: str = "; or pass --stack-file FILE"
) -> Path:
    """The file of an existing stack, or StackNotFound saying what exists instead (and
    ``otherwise``: the command's other way to name one, "" when it has none)."""
    path = stack_file(name, stacks_dir)
    if name and path.is_file():
        return path
    known = stack_names(stacks_dir)
    listing = ", ".join(known) if known else "none yet"
    raise StackNotFound(
        f"no stack {name!r}: {_shown(path)} does not exist{did_you_mean(name, known)}. "
        f"Known stacks: {listing}{otherwise}"
    )


def _shown(path: Path) -> str:
    """The path from the working directory when it is under it (relative to the checkout, as
    `make` runs the scripts), else whole: a message's path as short as it can be."""
    try:
        return str(path.relative_to(Path.cwd()))
    except (ValueError, OSError):
        return str(path)
