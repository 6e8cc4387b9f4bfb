"""What every check is built from: the :class:`Node` facts it reads, the catalog
:class:`Thresholds` it may read, and :func:`check`, which names a check function and says in
which runs it applies and which thresholds it reads.

A check is a plain function ``(node, th) -> Check | Sequence[Check] | None``: None when it
has nothing to say about this node (the temperature check on a report without temperatures),
several checks when one measurement gives several lines (scratch read and write).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bootstrap.verify.expected import Expected
from bootstrap.verify.verdict import Check
from infra.catalog import Gpu

# The runs a check can belong to: one node's GPU or CPU (--cpu) run, and the cross-node run.
GPU, CPU, CROSS = "gpu", "cpu", "cross"
LOCAL = frozenset({GPU, CPU})

Result = Check | Sequence[Check] | None
CATALOG_FILE = "infra/catalog/gpus.toml"


class ThresholdError(LookupError):
    """A check read a threshold that it did not declare, or that the catalog lacks.

    Not a KeyError on purpose: ``Mapping.get`` and ``in`` would turn that into a silent
    default, the very fallback constant this class exists to rule out."""


@dataclass(frozen=True)
class Thresholds(Mapping[str, float]):
    """The catalog thresholds one check may read: only those it declared (so the list in
    :func:`check` is the truth a test can hold the catalog to), and only from the catalog."""

    table: Mapping[str, float]
    allowed: frozenset[str]
    check_name: str = ""

    def __getitem__(self, key: str) -> float:
        if key not in self.allowed:
            raise ThresholdError(
                f"check {self.check_name!r} reads threshold {key!r} without declaring it"
            )
        if key not in self.table:
            raise ThresholdError(
                f"threshold {key!r} (check {self.check_name!r}) is not in the catalog: add it "
                f"to [defaults.thresholds] in {CATALOG_FILE}"
            )
        return float(self.table[key])

    def get(self, key: str, default: Any = None) -> Any:
        """Refused: a default here would hide a threshold missing from the catalog."""
        raise ThresholdError(
            f"check {self.check_name!r} asked for threshold {key!r} with a default: read "
            "th[key], the catalog has every threshold a check declares"
        )

    def __iter__(self) -> Iterator[str]:
        return (k for k in self.table if k in self.allowed)

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True)
class Node:
    """The facts the checks read: one node's raw report (or, for the cross-node run, the
    run all nodes shared), the expectation, and the GPU whose catalog entry sets the
    performance bar (None: none known, or a CPU run)."""

    report: Mapping[str, Any]
    exp: Expected
    gpu: Gpu | None = None
    run_kind: str = GPU
    problems: tuple[str, ...] = ()  # the cross-node run: what went wrong, host by host

    @property
    def nvidia(self) -> Mapping[str, Any]:
        return self.report.get("nvidia") or {}

    @property
    def gpus(self) -> list[dict[str, Any]]:
        return list(self.nvidia.get("gpus") or [])

    @property
    def torch(self) -> Mapping[str, Any]:
        return self.report.get("torch") or {}

    @property
    def run(self) -> Mapping[str, Any]:
        """What the node's torchrun measured (GEMM, HBM, all-reduce, training)."""
        return self.report.get("torchrun") or {}

    @property
    def load(self) -> dict[Any, dict[str, Any]]:
        """nvidia-smi samples taken under load, summarised per GPU index."""
        return {g["index"]: g for g in ((self.report.get("load") or {}).get("gpus") or [])}

    @property
    def suffix(self) -> str:
        """How the run's check names end: ``train`` on a node, ``train.cross`` across nodes."""
        return ".cross" if self.run_kind == CROSS else ""


CheckFn = Callable[[Node, Thresholds], Result]


@dataclass(frozen=True)
class CheckSpec:
    """One registered check: its name (as the verdict shows it), the function, the runs it
    belongs to and the catalog thresholds it reads.

    ``gate``: a result from this check ends the node's checks, except the ``always`` ones
    (no GPU on the node: nothing GPU-side can be judged, but the bucket still can)."""

    name: str
    fn: CheckFn
    runs: frozenset[str]
    thresholds: frozenset[str] = field(default_factory=frozenset)
    gate: bool = False
    always: bool = False

    def __call__(self, node: Node, th: Mapping[str, float]) -> list[Check]:
        """The check's lines for this node (empty: nothing to say)."""
        view = Thresholds(th, self.thresholds, self.name)
        out = self.fn(node, view)
        if out is None:
            return []
        return [out] if isinstance(out, Check) else list(out)


def check(
    name: str,
    *,
    runs: Sequence[str] | frozenset[str],
    thresholds: Sequence[str] = (),
    gate: bool = False,
    always: bool = False,
) -> Callable[[CheckFn], CheckSpec]:
    """Register a function as the check ``name`` (the registry's order is checks/__init__)."""

    def wrap(fn: CheckFn) -> CheckSpec:
        return CheckSpec(name, fn, frozenset(runs), frozenset(thresholds), gate, always)

    return wrap


def run_error(run: Mapping[str, Any]) -> str:
    """Why the node's torchrun measured nothing, in a line."""
    errors = run.get("errors") or []
    if errors:
        return str(errors[0])[:300]
    return "torchrun did not run" if not run else f"torchrun exited {run.get('rc')}"


# Thresholds that ``verdict.grade`` reads: every check that grades declares them.
GRADE = ("pass_ratio", "warn_ratio")
