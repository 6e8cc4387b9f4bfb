"""The run to size: the published model shapes (models.toml), the planning assumptions
(sizing.toml) and the Workload that says what is trained, on how much data, and how.

Read by infra.pricing.sizing (the advisor) and scripts/size.py (the command line); the
formulas that turn a Workload into memory and time are infra.pricing.memory and
infra.pricing.speed.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from infra.catalog import DATA_DIR, Catalog, CatalogError, _date, load_catalog
from infra.suggest import did_you_mean

PRECISIONS = ("bf16", "fp16", "fp32")
OPTIMIZERS = ("adamw", "adamw-8bit", "adafactor", "sgd")
STRATEGIES = ("ddp", "fsdp")
ATTENTION = ("flash", "eager")


class SizingError(ValueError):
    """Bad input to the advisor; `.problems` holds one line per problem, each saying the fix."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


# ----------------------------------------------------------------------------------------------
# data: models.toml and sizing.toml


@dataclass(frozen=True)
class ModelSpec:
    key: str
    name: str
    kind: str  # transformer | cnn
    params: int
    layers: int
    seq_len: int
    source: str
    hidden: int | None = None
    heads: int | None = None
    vocab: int | None = None
    train_flops_per_sample: float | None = None  # cnn
    activation_bytes_per_sample: float | None = None  # cnn, mixed precision
    activation_bytes_per_sample_fp32: float | None = None  # cnn, fp32
    note: str = ""


@dataclass(frozen=True)
class Assumptions:
    headroom: float
    overhead_gb: float
    fsdp_gathered_layers: int
    spot_overhead: float
    scaling: tuple[tuple[float, float], ...]  # (min_network_gbps, per_doubling), highest first
    date: dt.date
    source: str
    estimate: bool


def _sources_ok(text: str, where: str, catalog: Catalog) -> None:
    for tag in text.replace(",", " ").split():
        if tag not in catalog.sources:
            raise CatalogError(f"{where}: source {tag!r} is not in sources.toml")


def parse_models(data: Mapping[str, Any], catalog: Catalog) -> Mapping[str, ModelSpec]:
    out = {}
    for key, m in data.get("models", {}).items():
        where = f"models.{key}"
        kind = m.get("kind")
        if kind not in ("transformer", "cnn"):
            raise CatalogError(f"{where}: kind must be transformer or cnn, got {kind!r}")
        need = (
            ("hidden", "heads", "vocab") if kind == "transformer" else ("train_flops_per_sample",)
        )
        for k in ("params", "layers", "seq_len", "source", *need):
            if k not in m:
                raise CatalogError(f"{where}: '{k}' is required for a {kind}")
        _sources_ok(str(m["source"]), where, catalog)
        out[key] = ModelSpec(
            key=key,
            name=str(m.get("name", key)),
            kind=kind,
            params=int(m["params"]),
            layers=int(m["layers"]),
            seq_len=int(m["seq_len"]),
            source=str(m["source"]),
            hidden=m.get("hidden"),
            heads=m.get("heads"),
            vocab=m.get("vocab"),
            train_flops_per_sample=m.get("train_flops_per_sample"),
            activation_bytes_per_sample=m.get("activation_bytes_per_sample"),
            activation_bytes_per_sample_fp32=m.get("activation_bytes_per_sample_fp32"),
            note=str(m.get("note", "")),
        )
    return MappingProxyType(out)


def parse_assumptions(data: Mapping[str, Any], catalog: Catalog) -> Assumptions:
    try:
        mem, tim = data["memory"], data["time"]
        _sources_ok(str(mem["source"]), "sizing.memory", catalog)
        _sources_ok(str(tim["source"]), "sizing.time", catalog)
        scaling = sorted(
            ((float(r["min_network_gbps"]), float(r["per_doubling"])) for r in tim["scaling"]),
            reverse=True,
        )
        a = Assumptions(
            headroom=float(mem["headroom"]),
            overhead_gb=float(mem["overhead_gb"]),
            fsdp_gathered_layers=int(mem["fsdp_gathered_layers"]),
            spot_overhead=float(tim["spot_overhead"]),
            scaling=tuple(scaling),
            date=_date(mem["date"], "sizing.memory"),
            source=str(mem["source"]),
            estimate=bool(mem.get("estimate", False) or tim.get("estimate", False)),
        )
    except KeyError as exc:
        raise CatalogError(f"sizing.toml: missing key {exc}") from None
    if not 0 <= a.headroom < 1 or a.spot_overhead < 0 or not scaling or scaling[-1][0] != 0:
        raise CatalogError(
            "sizing.toml: headroom in [0, 1), spot_overhead >= 0, and a scaling row "
            "with min_network_gbps = 0 are required"
        )
    if any(not 0 < eff <= 1 for _, eff in scaling):
        raise CatalogError("sizing.toml: per_doubling must lie in (0, 1]")
    return a


def _read(name: str) -> dict[str, Any]:
    with (DATA_DIR / name).open("rb") as fh:
        return tomllib.load(fh)


@functools.lru_cache(maxsize=1)
def load_models() -> Mapping[str, ModelSpec]:
    return parse_models(_read("models.toml"), load_catalog())


@functools.lru_cache(maxsize=1)
def load_assumptions() -> Assumptions:
    return parse_assumptions(_read("sizing.toml"), load_catalog())


def params_from_shape(layers: int, hidden: int, vocab: int, seq_len: int) -> int:
    """A GPT-style decoder's parameter count: 12*L*h^2 (attention 4h^2 + MLP 8h^2) plus 13*L*h
    (biases and layer norms), token and position embeddings (v + s)*h and the final norm 2h.
    Gives GPT-2's published 124,439,808 from its shape."""
    return 12 * layers * hidden**2 + 13 * layers * hidden + (vocab + seq_len) * hidden + 2 * hidden


# ----------------------------------------------------------------------------------------------
# the run


@dataclass(frozen=True)
class Workload:
    """What is trained, on how much data, and how."""

    params: float
    tokens: float
    kind: str = "transformer"
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    seq_len: int | None = None
    micro_batch: int = 1
    vocab: int | None = None
    precision: str = "bf16"
    optimizer: str = "adamw"
    momentum: bool = True  # sgd only
    strategy: str = "ddp"
    grad_checkpointing: bool = False
    attention: str = "flash"
    model: str | None = None
    train_flops_per_sample: float | None = None  # cnn
    activation_bytes_per_sample: float | None = None  # cnn, in the chosen precision

    def __post_init__(self) -> None:
        problems = []
        if not (self.params > 0 and math.isfinite(self.params)):
            problems.append(f"params must be a number above 0, got {self.params:g}")
        if not (self.tokens > 0 and math.isfinite(self.tokens)):
            problems.append(f"tokens must be a number above 0, got {self.tokens:g}")
        for label, value, choices in (
            ("precision", self.precision, PRECISIONS),
            ("optimizer", self.optimizer, OPTIMIZERS),
            ("strategy", self.strategy, STRATEGIES),
            ("attention", self.attention, ATTENTION),
        ):
            if value not in choices:
                problems.append(
                    f"{label} {value!r} is unknown: use one of {', '.join(choices)}"
                    + did_you_mean(value, choices)
                )
        for label, n in (
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("seq-len", self.seq_len),
            ("vocab", self.vocab),
            ("micro-batch", self.micro_batch),
        ):
            if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
                problems.append(f"{label} must be a whole number >= 1, got {n!r}")
        if problems:
            raise SizingError(problems)

    @property
    def mixed(self) -> bool:
        return self.precision != "fp32"

    @property
    def has_shape(self) -> bool:
        if self.kind == "cnn":
            return self.activation_bytes_per_sample is not None
        return None not in (self.layers, self.hidden, self.seq_len)


# A dense decoder's count from its shape (12 L h^2 + embeddings) is within a few percent of
# the published one for every transformer in models.toml (GPT-2 1.01, Llama-2-7B 1.03,
# Llama-3-8B 1.15 with its larger MLP); outside this factor the shape and --params describe
# different models (or a mixture of experts, which 6ND and these memory formulas do not cover).
SHAPE_PARAMS_FACTOR = 2.0


def shape_problems(w: Workload) -> list[str]:
    """What is wrong with a transformer's shape: heads that do not divide the hidden size, or
    a layer count and hidden size that cannot hold the parameter count."""
    problems: list[str] = []
    if w.kind != "transformer":
        return problems
    if w.heads is not None and w.hidden is not None and w.hidden % w.heads:
        near = _near_divisor(w.hidden, w.heads)
        problems.append(
            f"--heads: {w.heads} heads do not divide the hidden size {w.hidden} (each head "
            f"gets hidden/heads dimensions): give a divisor, e.g. {near}"
        )
    if w.layers is not None and w.hidden is not None:
        shaped = 12 * w.layers * w.hidden**2 + (w.vocab or 0) * w.hidden
        ratio = w.params / shaped
        if not 1 / SHAPE_PARAMS_FACTOR <= ratio <= SHAPE_PARAMS_FACTOR:
            problems.append(
                f"--layers {w.layers} --hidden {w.hidden} make a model of about "
                f"{_count(shaped)} parameters, not {_count(w.params)} ({ratio:.2g}x): fix the "
                "shape or the parameter count (a mixture of experts is not modelled)"
            )
    return problems


def _near_divisor(hidden: int, heads: int) -> int:
    """The divisor of `hidden` nearest to `heads` (ties: the smaller)."""
    divisors = [d for d in range(1, hidden + 1) if hidden % d == 0]
    return min(divisors, key=lambda d: (abs(d - heads), d))


def _count(n: float) -> str:
    for k, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= k:
            return f"{n / k:.3g}{unit}"
    return f"{n:.3g}"


def workload_for_model(spec: ModelSpec, tokens: float, **kw: Any) -> Workload:
    """A Workload from a models.toml row; keyword arguments override the row's shape."""
    precision = kw.get("precision", "bf16")
    shape: dict[str, Any] = {
        "params": float(spec.params),
        "kind": spec.kind,
        "layers": spec.layers,
        "hidden": spec.hidden,
        "heads": spec.heads,
        "seq_len": spec.seq_len,
        "vocab": spec.vocab,
        "model": spec.key,
    }
    if spec.kind == "cnn":
        shape["train_flops_per_sample"] = spec.train_flops_per_sample
        shape["activation_bytes_per_sample"] = (
            spec.activation_bytes_per_sample_fp32
            if precision == "fp32"
            else spec.activation_bytes_per_sample
        )
    shape.update({k: v for k, v in kw.items() if v is not None})
    return Workload(tokens=tokens, **shape)
