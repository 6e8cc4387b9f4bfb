#!/usr/bin/env python3
"""Which GPU tier fits a training run, how long it takes, and what the whole run costs.

    python scripts/size.py --model llama-2-7b --tokens 1e9
    python scripts/size.py --params 7B --layers 32 --hidden 4096 --seq-len 4096 --tokens 2B \\
        --strategy fsdp --grad-checkpointing --deadline 2d --budget "5000 USD"
    python scripts/size.py --model resnet50 --epochs 10 --dataset-samples 1.28M --json
    python scripts/size.py --model gpt2 --tokens 1e9 --write-stack gpt2-run
    python scripts/size.py --list-models

Every tier x provider x billing mode (and 2 or 4 nodes of the 8-GPU tiers; with --deadline,
up to a stack's node limit) is ranked by the cost of the whole run in one common currency.
Exit status (docs/exit-status.md): 0 an option fits and is left; 1 nothing fits, or every
option is filtered out (the report says why), or the catalog data itself is broken; 2 bad
input, or a deadline or budget that no fitting option meets (one line per problem on stderr).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import re
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a file from a checkout without the editable install
    sys.path.insert(0, str(REPO))

from infra.catalog import CatalogError, Feature, ProviderInfo, load_catalog  # noqa: E402
from infra.pricing.billing_modes import BILLING_MODES  # noqa: E402
from infra.pricing.sizing import (  # noqa: E402
    FILTERED,
    NO_FIT,
    NO_PRICE,
    OK,
    Filters,
    Option,
    SizingResult,
    best_fix,
    size,
    with_fix,
)
from infra.pricing.workload import (  # noqa: E402
    ATTENTION,
    OPTIMIZERS,
    PRECISIONS,
    STRATEGIES,
    ModelSpec,
    SizingError,
    Workload,
    load_models,
    shape_problems,
    workload_for_model,
)
from infra.short_lived import one_command  # noqa: E402
from infra.stackfiles import stack_file  # noqa: E402
from infra.usage import fit  # noqa: E402

STACKS_DIR = REPO / "stacks"
REPORTS_DIR = REPO / "reports"
# A token count above this is a typo, not a run: the largest published pretraining runs are
# tens of trillions (Meta, "Introducing Meta Llama 3", 2024-04-18: "pretrained on over 15T
# tokens"); 1e15 leaves a 60-fold margin. Past it the table's hours and costs overflow it.
MAX_TOKENS = 1e15
WIDTH = 80
SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?")
DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([mhdw]?)\s*", re.IGNORECASE)
HOURS_PER_UNIT = {"m": 1 / 60, "h": 1.0, "": 1.0, "d": 24.0, "w": 168.0}
# a best answer slower than this gets a hint to give a deadline
LONG_RUN_HOURS = 7 * 24
STACK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
DOC_CIDR = "203.0.113.0/24"


class UsageError(Exception):
    """Bad command-line input: printed on stderr, exit status 2."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


# ----------------------------------------------------------------------------------------------
# input


def parse_amount(flag: str, text: str | None, problems: list[str], *, whole: bool = False) -> Any:
    """'7e9', '7B', '1.5M', '1_000', '1,000' -> a number; a problem line when it is not one."""
    if text is None:
        return None
    raw = text.strip().replace("_", "")
    example = "e.g. 4096" if whole else "e.g. 7e9 or 7B"
    k = 1.0
    if raw and raw[-1].lower() in SUFFIXES:
        k, raw = SUFFIXES[raw[-1].lower()], raw[:-1]
        if "e" in raw.lower():
            # 1e9B would be 1e18: an exponent or a suffix, never both
            problems.append(f"{flag}: {text!r} has both an exponent and a suffix ({example})")
            return None
    if "," in raw:
        # a comma groups thousands (1,000,000); 1,5B is a decimal comma and would read as 15B
        if not THOUSANDS.fullmatch(raw):
            problems.append(
                f"{flag}: {text!r}: a comma only groups thousands (1,000); "
                "write a decimal point (1.5B)"
            )
            return None
        raw = raw.replace(",", "")
    try:
        value = float(raw) * k
    except ValueError:
        problems.append(f"{flag}: {text!r} is not a number ({example})")
        return None
    if not math.isfinite(value):
        problems.append(f"{flag}: must be a finite number, got {text!r}")
        return None
    if value <= 0:
        problems.append(f"{flag}: must be above 0, got {text!r}")
        return None
    if whole:
        if value != int(value):
            problems.append(f"{flag}: must be a whole number, got {text!r}")
            return None
        return int(value)
    return value


def parse_budget(text: str | None, problems: list[str]) -> tuple[float | None, str | None]:
    """'5000', '5000 USD', '5000USD', 'CNY 36000' -> (amount, currency or None)."""
    if text is None:
        return None, None
    m = re.fullmatch(r"\s*([A-Za-z]{3})?\s*([0-9][0-9_,.]*[kKmM]?)\s*([A-Za-z]{3})?\s*", text)
    if not m or (m.group(1) and m.group(3)):
        problems.append(f"--budget: {text!r} is not an amount with a currency (e.g. '5000 USD')")
        return None, None
    amount = parse_amount("--budget", m.group(2), problems)
    currency = (m.group(1) or m.group(3) or "").upper() or None
    return amount, currency


def parse_duration(flag: str, text: str | None, problems: list[str]) -> float | None:
    """'7d', '36h', '90m', '2w' or a plain number of hours -> hours."""
    if text is None:
        return None
    m = DURATION.fullmatch(text)
    if not m:
        problems.append(f"{flag}: {text!r} is not a duration (e.g. 7d, 36h, 90m, 2w)")
        return None
    hours = float(m.group(1)) * HOURS_PER_UNIT[m.group(2).lower()]
    if not hours > 0:
        problems.append(f"{flag}: must be above 0, got {text!r}")
        return None
    return hours


def parse_list(flag: str, text: str | None, choices: Sequence[str], problems: list[str]) -> Any:
    if text is None:
        return None
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        problems.append(f"{flag}: give one or more of {', '.join(choices)}")
    return items


class Parser(argparse.ArgumentParser):
    """argparse, but its complaints are one line and exit 2 like every other bad input."""

    def error(self, message: str) -> Any:
        raise UsageError([f"{message} (see --help)"])


def join_negative_values(argv: Sequence[str]) -> list[str]:
    """`--params -7e9` -> `--params=-7e9`, so a negative size is reported as one, not taken
    for an unknown option."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.match(r"^-[\d.]", token):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        description=(__doc__ or "").splitlines()[0],
        epilog="Numbers accept e notation and K/M/B/T suffixes (7e9, 7B, 1.28M).",
    )
    what = p.add_argument_group("the model")
    what.add_argument("--model", help="a model from the built-in table (--list-models)")
    what.add_argument("--params", help="parameter count, e.g. 7e9 or 7B (instead of --model)")
    what.add_argument("--layers", help="transformer layers (for activation memory)")
    what.add_argument("--hidden", help="hidden size")
    what.add_argument("--heads", help="attention heads (eager attention only; default hidden/128)")
    what.add_argument("--seq-len", help="tokens per sequence (default: the model's context)")
    what.add_argument("--micro-batch", help="sequences per GPU per step (default 1)")
    what.add_argument("--vocab", help="vocabulary size (the fp32 logits of the loss)")
    what.add_argument("--list-models", action="store_true", help="print the built-in table")
    data = p.add_argument_group("the data")
    data.add_argument("--tokens", help="training tokens, e.g. 1e9 (CNN: images)")
    data.add_argument("--samples", help="training samples; tokens = samples x --seq-len")
    data.add_argument("--epochs", help="passes over the data set (with --dataset-*)")
    data.add_argument("--dataset-samples", help="samples in the data set (with --epochs)")
    data.add_argument("--dataset-tokens", help="tokens in the data set (with --epochs)")
    how = p.add_argument_group("the training")
    how.add_argument("--precision", default="bf16", help=f"{' | '.join(PRECISIONS)} (default bf16)")
    how.add_argument(
        "--optimizer", default="adamw", help=f"{' | '.join(OPTIMIZERS)} (default adamw)"
    )
    how.add_argument("--no-momentum", action="store_true", help="sgd without momentum")
    how.add_argument("--strategy", default="ddp", help="ddp (replicated) | fsdp (sharded, ZeRO-3)")
    how.add_argument("--grad-checkpointing", action="store_true", help="recompute activations")
    how.add_argument("--attention", help="flash (SDPA, default) | eager (stores the scores)")
    pick = p.add_argument_group("what to consider")
    pick.add_argument(
        "--deadline",
        help="finish within this (7d, 36h, 90m, 2w): the cheapest option that does, across "
        "clouds and node counts up to the stack limit (unless --max-nodes)",
    )
    pick.add_argument("--deadline-hours", help="the same as --deadline, in hours")
    pick.add_argument("--budget", help="drop options that cost more, e.g. '5000 USD'")
    pick.add_argument("--currency", default="USD", help="common currency for ranking (USD)")
    pick.add_argument(
        "--providers", help="comma-separated (default: every provider in the catalog)"
    )
    pick.add_argument(
        "--billing", help=f"comma-separated of {', '.join(BILLING_MODES)} (default all)"
    )
    pick.add_argument(
        "--max-nodes",
        help="most nodes of an 8-GPU tier (default 4; with --deadline, the stack limit)",
    )
    pick.add_argument(
        "--reports", default=None, help="verify-gpu reports to calibrate MFU (default reports/)"
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="one JSON object on stdout")
    out.add_argument("--top", default="10", help="options shown in the table (default 10)")
    out.add_argument("--all", action="store_true", help="show every option")
    out.add_argument("--write-stack", metavar="NAME", help="write stacks/Pulumi.NAME.yaml")
    out.add_argument("--row", help="the option --write-stack uses (default: 1, the best)")
    out.add_argument("--force", action="store_true", help="let --write-stack replace a file")
    out.add_argument("--stacks-dir", default=str(STACKS_DIR), help=argparse.SUPPRESS)
    return p


def workload_from_args(args: argparse.Namespace) -> Workload:
    """Every problem with the model, data and training flags at once (UsageError)."""
    problems: list[str] = []
    spec = _model_from_args(args, problems)
    params = parse_amount("--params", args.params, problems)
    shape = {
        k: parse_amount(f"--{k.replace('_', '-')}", getattr(args, k), problems, whole=True)
        for k in ("layers", "hidden", "heads", "seq_len", "micro_batch", "vocab")
    }
    seq = shape["seq_len"] or (spec.seq_len if spec else None)
    if spec is not None and spec.kind == "cnn":
        _refuse_transformer_flags(args, spec, problems)
        seq = spec.seq_len
    tokens = _tokens_from_args(args, seq, problems)
    _check_training_flags(args, problems)
    if problems:
        raise UsageError(problems)
    common = {
        "precision": args.precision,
        "optimizer": args.optimizer,
        "momentum": not args.no_momentum,
        "strategy": args.strategy,
        "grad_checkpointing": args.grad_checkpointing,
        "attention": args.attention or "flash",
    }
    assert tokens is not None
    try:
        if spec is not None:
            w = workload_for_model(spec, tokens, **common, **shape)
        else:
            shape["micro_batch"] = shape["micro_batch"] or 1
            w = Workload(
                params=params,
                tokens=tokens,
                **common,
                **{k: v for k, v in shape.items() if v is not None},
            )
    except SizingError as exc:
        raise UsageError(exc.problems) from None
    if shape_problems(w):
        raise UsageError(shape_problems(w))
    return w


# flags that describe a transformer's shape or attention: a CNN's figures are per image
TRANSFORMER_FLAGS = ("layers", "hidden", "heads", "seq_len", "vocab", "attention")


def _refuse_transformer_flags(
    args: argparse.Namespace, spec: ModelSpec, problems: list[str]
) -> None:
    given = [f"--{k.replace('_', '-')}" for k in TRANSFORMER_FLAGS if getattr(args, k) is not None]
    if given:
        problems.append(
            f"{', '.join(given)}: {spec.key} is a CNN, sized per image from models.toml; "
            "these describe a transformer: leave them out (count images with --tokens or "
            "--epochs --dataset-samples)"
        )


def _model_from_args(args: argparse.Namespace, problems: list[str]) -> ModelSpec | None:
    """The models.toml row --model names (None with --params); problems appended."""
    models = load_models()
    if args.model and args.params:
        problems.append("give --model or --params, not both")
    elif args.model:
        spec = models.get(args.model.lower())
        if spec is None:
            from infra.suggest import did_you_mean

            problems.append(
                f"--model: unknown model {args.model!r}{did_you_mean(args.model.lower(), models)}; "
                f"known: {', '.join(models)} (or give --params)"
            )
        return spec
    elif not args.params:
        problems.append("give --model NAME (see --list-models) or --params N")
    return None


def _tokens_from_args(
    args: argparse.Namespace, seq: float | None, problems: list[str]
) -> float | None:
    """The training tokens, from exactly one of --tokens, --samples or --epochs (with the
    dataset's size); problems appended."""
    tokens = parse_amount("--tokens", args.tokens, problems)
    samples = parse_amount("--samples", args.samples, problems, whole=True)
    epochs = parse_amount("--epochs", args.epochs, problems)
    ds_samples = parse_amount("--dataset-samples", args.dataset_samples, problems, whole=True)
    ds_tokens = parse_amount("--dataset-tokens", args.dataset_tokens, problems)
    for flag, text, value in (
        ("--tokens", args.tokens, tokens),
        ("--dataset-tokens", args.dataset_tokens, ds_tokens),
    ):
        if value is not None and value < 1:
            problems.append(f"{flag}: {text!r} is less than one token: check the exponent")
    tokens = None if tokens is not None and tokens < 1 else tokens
    ds_tokens = None if ds_tokens is not None and ds_tokens < 1 else ds_tokens
    if args.dataset_samples is not None and args.dataset_tokens is not None:
        problems.append("give --dataset-samples or --dataset-tokens, not both")
    elif args.epochs is None:
        for flag, text in (
            ("--dataset-samples", args.dataset_samples),
            ("--dataset-tokens", args.dataset_tokens),
        ):
            if text is not None:
                problems.append(f"{flag} is read with --epochs only: add --epochs E or drop it")
    given = [
        n
        for n, v in (
            ("--tokens", args.tokens),
            ("--samples", args.samples),
            ("--epochs", args.epochs),
        )
        if v is not None  # given, even when empty or bad: its own line says what is wrong
    ]
    if len(given) > 1:
        problems.append(f"give one of --tokens, --samples, --epochs, not {' and '.join(given)}")
    elif not given:
        problems.append("give the data: --tokens N, --samples N, or --epochs E with --dataset-*")
    if samples is not None and len(given) == 1:
        if seq is None:
            problems.append("--samples needs --seq-len (tokens = samples x seq-len)")
        else:
            tokens = samples * seq
    if args.epochs is not None and len(given) == 1:
        if ds_tokens is not None:
            tokens = (epochs or 0) * ds_tokens
        elif ds_samples is not None:
            if seq is None:
                problems.append("--epochs with --dataset-samples needs --seq-len")
            else:
                tokens = (epochs or 0) * ds_samples * seq
        elif args.dataset_samples is None and args.dataset_tokens is None:
            problems.append("--epochs needs --dataset-samples N or --dataset-tokens N")
    if args.epochs is not None and tokens is not None and tokens < 1:
        problems.append(f"--epochs: {tokens:.3g} tokens in all is under one: check the exponent")
        return None
    if tokens is not None and tokens > MAX_TOKENS:
        problems.append(
            f"{given[0] if given else '--tokens'}: {tokens:.3g} tokens is over {MAX_TOKENS:.0e}, "
            "more than any training run has seen: check the exponent"
        )
        return None
    return tokens


def _check_training_flags(args: argparse.Namespace, problems: list[str]) -> None:
    """--precision, --optimizer, --strategy, --attention and --no-momentum."""
    for flag, value, choices in (
        ("--precision", args.precision, PRECISIONS),
        ("--optimizer", args.optimizer, OPTIMIZERS),
        ("--strategy", args.strategy, STRATEGIES),
        ("--attention", args.attention or "flash", ATTENTION),
    ):
        if value not in choices:
            from infra.suggest import did_you_mean

            problems.append(
                f"{flag}: {value!r} is unknown; use one of {', '.join(choices)}"
                + did_you_mean(value, choices)
            )
    if args.no_momentum and args.optimizer != "sgd":
        problems.append("--no-momentum applies to --optimizer sgd only")


def filters_from_args(args: argparse.Namespace) -> tuple[Filters, str, int, int | None]:
    problems: list[str] = []
    from infra.config import MAX_NODES

    if args.deadline is not None and args.deadline_hours is not None:
        problems.append("give --deadline or --deadline-hours, not both")
    deadline = parse_duration("--deadline", args.deadline, problems)
    if args.deadline_hours is not None:
        deadline = parse_amount("--deadline-hours", args.deadline_hours, problems)
    budget, budget_currency = parse_budget(args.budget, problems)
    max_nodes = parse_amount("--max-nodes", args.max_nodes, problems, whole=True)
    if max_nodes is not None and max_nodes > MAX_NODES:
        problems.append(
            f"--max-nodes: {max_nodes} is more than a stack allows ({MAX_NODES} nodes, "
            "gpufleet:nodes): give at most that"
        )
    if max_nodes is None:
        # a deadline asks for the cheapest option that finishes in time: let it look as far
        # as a stack can go; without one, the usual few nodes keep the table short
        max_nodes = MAX_NODES if deadline is not None else 4
    top = parse_amount("--top", args.top, problems, whole=True)
    row = parse_amount("--row", args.row, problems, whole=True)
    if args.row is not None and args.write_stack is None:
        problems.append("--row picks the option --write-stack writes: give --write-stack NAME")
    providers = parse_list("--providers", args.providers, list(load_catalog().providers), problems)
    billings = parse_list("--billing", args.billing, BILLING_MODES, problems)
    if args.reports is not None and not (args.reports.strip() and Path(args.reports).is_dir()):
        problems.append(f"--reports {args.reports!r}: no such folder (verify-gpu's reports)")
    if args.write_stack is not None and not STACK_NAME.match(args.write_stack):
        problems.append(
            f"--write-stack: {args.write_stack!r} is not a stack name "
            "(letters, digits, '-', '_', '.'; starting with a letter or digit)"
        )
    if problems:
        raise UsageError(problems)
    f = Filters(
        deadline_hours=deadline,
        budget=budget,
        budget_currency=budget_currency,
        providers=providers,
        billings=billings,
        max_nodes=max_nodes,
    )
    return f, args.currency.upper(), top or 10, row


# ----------------------------------------------------------------------------------------------
# output (plain text through rich: markup, emoji and highlighting off, so no catalog or user
# text is ever read as markup)


def _gb(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _num(x: float) -> str:
    """7.0B, 124M, 1.3T: counts for people."""
    for k, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if x >= k:
            return f"{x / k:.3g}{unit}"
    return f"{x:g}"


def _money(x: float | None, currency: str = "") -> str:
    if x is None:
        return "-"
    text = f"{x:,.0f}" if x >= 100 else f"{x:,.2f}"
    return f"{text} {currency}".strip()


def _hours(h: float | None) -> str:
    if h is None:
        return "-"
    if h < 1:
        return f"{h:.2f}"
    return f"{h:,.1f}" if h < 1000 else f"{h:,.0f}"


def _billing(o: Option) -> str:
    if o.billing == "subscription" and o.months:
        return f"sub {o.months}mo"
    return o.billing


NBSP = "\u00a0"  # keeps "a100x8 x2" on one line when wrapping; printed as a plain space


def _wrap(text: str, indent: str = "  ", first: str | None = None) -> list[str]:
    lines = textwrap.wrap(
        text,
        WIDTH,
        initial_indent=indent if first is None else first,
        subsequent_indent=indent + "  ",
        break_on_hyphens=False,
    )
    return [line.replace(NBSP, " ") for line in lines]


def _section_workload(result: SizingResult, model_name: str | None) -> list[str]:
    """The title and what is trained: precision, optimizer, strategy, shape and FLOPs."""
    w = result.workload
    lines: list[str] = []
    title = f"{w.model} ({model_name})" if w.model else "custom model"
    unit = "images" if w.kind == "cnn" else "tokens"
    lines += _wrap(
        f"gpufleet size: {title}, {_num(w.params)} params, {_num(w.tokens)} {unit}", "", ""
    )
    shape = ""
    if w.kind == "transformer" and w.seq_len:
        shape = f", sequences of {w.seq_len} tokens, micro-batch {w.micro_batch} per GPU"
    elif w.kind == "cnn":
        shape = f", micro-batch {w.micro_batch}"
    opt = w.optimizer + (" (no momentum)" if w.optimizer == "sgd" and not w.momentum else "")
    ckpt = "gradient checkpointing" if w.grad_checkpointing else "no checkpointing"
    lines += _wrap(f"{w.precision}, {opt}, {w.strategy}, {ckpt}, {w.attention} attention")
    if shape:
        lines.append(f"  {shape.lstrip(', ')}")
    k = "8" if w.grad_checkpointing else "6"
    flops_how = (
        f"{k} x params x tokens" if w.kind == "transformer" else "measured FLOPs per image x images"
    )
    lines.append(f"  training FLOPs: {result.flops:.3g} ({flops_how})")
    return lines


def _section_memory(result: SizingResult) -> list[str]:
    """Memory per GPU, part by part with how each is counted, and the fit rule."""
    w, m, a = result.workload, result.memory, result.assumptions
    per = m.per_param
    rows = [
        ("weights", m.weights_gb, f"{per.weights:g} B/param"),
        ("gradients", m.gradients_gb, f"{per.gradients:g} B/param"),
        (
            "optimizer",
            m.optimizer_gb,
            f"{per.optimizer:g} B/param"
            + (f" (fp32 master copy {per.master:g} B included)" if per.master else ""),
        ),
        ("activations", m.activations_gb, m.activation_formula),
        ("overhead", m.overhead_gb, "CUDA context, workspaces, NCCL buffers (estimate)"),
    ]
    lines = ["Memory per GPU before sharding (GB)"]
    for name, value, how in rows:
        lines += _wrap(how, " " * 20, f"  {name:<12}{_gb(value):>6}  ")
    total = m.states_gb + (m.activations_gb or 0) + m.overhead_gb
    spread = (
        "ddp: all of it on every GPU"
        if w.strategy == "ddp"
        else "fsdp: weights, gradients, optimizer / GPUs"
    )
    lines.append(f"  {'total':<12}{_gb(total):>6}  {spread}")
    lines += _wrap(
        f"A tier fits when its per-GPU total stays under {1 - a.headroom:.0%} of the GPU's memory "
        f"({a.headroom:.0%} headroom). Bytes per parameter: {per.note} (ZeRO, Rajbhandari et "
        "al. 2020).",
        "  ",
    )
    return lines


def _and(names: Sequence[str]) -> str:
    """'A', 'A and B', 'A, B and C'."""
    if len(names) < 2:
        return "".join(names)
    return f"{', '.join(names[:-1])} and {names[-1]}"


def billing_note(providers: Sequence[ProviderInfo], spot_overhead: float) -> str:
    """The footnote on how spot and subscription rows are priced: which of these clouds sell
    a subscription, and why the others do not (both are catalog facts)."""
    text = (
        f"Spot: the middle of its range, with +{spot_overhead:.0%} hours for interruptions "
        "and restarts."
    )
    selling = [p.title or p.name for p in providers if "subscription" in p.billing]
    if selling:
        text += (
            f" Subscription: whole months on {_and(selling)}, only when cheaper than on-demand "
            "for the same hours."
        )
    for p in providers:
        if "subscription" not in p.billing:
            # the catalog gives every cloud without subscription billing its reason
            why = p.unsupported.get(Feature.SUBSCRIPTION, "not offered")
            text += f" No subscription on {p.title or p.name}: {why}."
    return text


def _considered(result: SizingResult) -> list[ProviderInfo]:
    """The clouds this run ranked, in the catalog's order."""
    chosen = result.filters.providers
    return [p for name, p in load_catalog().providers.items() if not chosen or name in chosen]


def _section_options(result: SizingResult, top: int, show_all: bool) -> list[str]:
    """The ranked table, its footnote and the best option spelled out."""
    cur = result.common_currency
    ok = [o for o in result.options if o.status == OK]
    shown = ok if show_all else ok[:top]
    lines = [f"Options ranked by the cost of the whole run in {cur}"]
    if not shown:
        return [*lines, "  no option is left: see below"]
    lines.append(
        f"{'#':>3} {'tier':<16}{'cloud':<9}{'billing':<10}{'GB/GPU':>9}"
        f"{'hours':>8}{'cost':>13}{cur:>10}"
    )
    index = {id(o): i + 1 for i, o in enumerate(result.options)}
    for o in shown:
        lines.append(_row(index[id(o)], o))
    if len(ok) > len(shown):
        lines.append(f"    ... {len(ok) - len(shown)} more (--all, or --json)")
    lines += _wrap(
        "~ an estimate (MFU not measured, or an estimated spot range or term). "
        + billing_note(_considered(result), result.assumptions.spot_overhead),
        "  ",
    )
    best = shown[0]
    lines += _long_run_hint(result, best)
    lines += _wrap(
        f"Best: {best.label} on {best.provider} ({best.instance_type}), {_billing(best)}: "
        f"{best.gpus}x {best.gpu_model}, {_hours(best.hours)} h, "
        f"{_money(best.cost, best.currency)}"
        + _range_note(best)
        + f". {best.peak_tflops:g} TF/s peak per GPU x MFU {best.mfu:.0%} x scaling "
        f"{best.scaling_efficiency:.2f}. Notes: {'; '.join(best.notes) or 'none'}.",
        "  ",
        "  ",
    )
    return lines


def _long_run_hint(result: SizingResult, best: Option) -> list[str]:
    """A best answer that runs for weeks, asked without a deadline: say how to trade money for
    time (the cheapest answer is often one node for months)."""
    if result.filters.deadline_hours is not None or (best.hours or 0) <= LONG_RUN_HOURS:
        return []
    fastest = min(result.viable, key=lambda o: o.hours or math.inf)
    return _wrap(
        f"The cheapest option takes {(best.hours or 0) / 24:,.0f} days; the fastest shown, "
        f"{fastest.label} on {fastest.provider}, {(fastest.hours or 0) / 24:,.1f} days. "
        "--deadline 7d (or any duration) ranks the cheapest that finishes in time, across "
        "clouds and node counts up to a stack's limit.",
        "  ",
        "  ",
    )


def _range_note(o: Option) -> str:
    """' (range 2,470-8,190)' for a spot range; the observation itself where the catalog saw
    one price once (a range of zero width says nothing)."""
    if o.spot_observation:
        return f" (spot price: {o.spot_observation})"
    if o.cost_range:
        return f" (range {_money(o.cost_range[0])}-{_money(o.cost_range[1])})"
    return ""


def render(
    result: SizingResult,
    *,
    top: int,
    show_all: bool,
    model_name: str | None,
    alternative: tuple[str, SizingResult] | None = None,
) -> str:
    """The report as plain lines no wider than 80 columns."""
    lines = _section_workload(result, model_name)
    lines.append("")
    lines += _section_memory(result)
    lines.append("")
    lines += _section_options(result, top, show_all)
    lines.append("")
    if alternative is not None:
        lines += render_alternative(alternative[1], alternative[0]).splitlines()
        lines.append("")

    lines += _section_no_fit(result)
    lines += _section_filtered(result, show_all)
    lines += _section_time(result)
    if result.warnings:
        lines.append("Warnings")
        for warning in result.warnings:
            lines += _wrap(warning, "  ", "  - ")
    return "\n".join(lines).rstrip() + "\n"


def render_alternative(alt: SizingResult, fix: str, count: int = 5) -> str:
    """The best few options of the same run with one fix applied (nothing fit as asked)."""
    lines = [f"Nothing fits as asked. With {fix}, the best options would be:"]
    lines.append(
        f"{'#':>3} {'tier':<16}{'cloud':<9}{'billing':<10}{'GB/GPU':>9}"
        f"{'hours':>8}{'cost':>13}{alt.common_currency:>10}"
    )
    for i, o in enumerate(alt.viable[:count], 1):
        lines.append(_row(i, o))
    lines += _wrap(f"Rerun with {fix} for the whole table, or --write-stack.", "  ")
    return "\n".join(lines) + "\n"


def _row(i: int, o: Option) -> str:
    mem = f"{o.per_gpu_memory_gb:.0f}/{o.gpu_memory_gb:g}"
    star = "~" if o.estimate else ""
    return (
        f"{i:>3} {o.label:<16.16}{o.provider:<9.9}{_billing(o):<10.10}"
        f"{mem:>9}{_hours(o.hours):>8}{_money(o.cost, o.currency):>13}"
        f"{star + _money(o.cost_common):>10}"
    )


def _section_no_fit(result: SizingResult) -> list[str]:
    """Tier sizes that do not fit, grouped by what would make them fit, each with its excess."""
    a = result.assumptions
    cat = load_catalog()
    # one entry per tier size and GPU memory: an A10G and an A10 (both 24 GB) are one line
    seen: dict[tuple[str, int, float], Option] = {}
    for o in result.options:
        if o.status == NO_FIT:
            seen.setdefault((o.tier, o.nodes, o.gpu_memory_gb), o)
    if not seen:
        return []
    lines = _wrap(
        f"Does not fit ({len(seen)} tier sizes, on every cloud and billing mode; the GB "
        f"each GPU needs beyond the {1 - a.headroom:.0%} of its memory that is usable)",
        "",
        "",
    )
    groups: dict[str | None, list[Option]] = {}
    for o in sorted(seen.values(), key=lambda o: (o.gpu_memory_gb, o.gpus)):
        groups.setdefault(o.fix, []).append(o)
    for fix, items in sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
        over = ", ".join(
            _over(o, cat.gpus[cat.tiers[o.tier].gpu].memory_gb, a.headroom) for o in items
        )
        if fix:
            head = f"fits with {fix}: "
        else:
            head = "no flag alone (more GPUs with --strategy fsdp, or a bigger GPU): "
        lines += _wrap(head + over, "  ", "  - ")
    lines.append("")
    return lines


def _over(o: Option, nominal_gb: float, headroom: float) -> str:
    """'a100x8 x2 13.5 GB over', naming the offer's GPU where its memory is not the one the
    tier names (Azure's a100x1 is an 80 GB card, V100s come in 16 and 32 GB)."""
    gpu = "" if o.gpu_memory_gb == nominal_gb else f" ({o.gpu_model})"
    excess = o.per_gpu_memory_gb - o.gpu_memory_gb * (1 - headroom)
    return f"{o.label}{gpu} {excess:.1f} GB over".replace(" ", NBSP)


def _section_filtered(result: SizingResult, show_all: bool) -> list[str]:
    f = result.filters
    out = [o for o in result.options if o.status in (FILTERED, NO_PRICE)]
    if not out and f.deadline_hours is None and f.budget is None:
        return []
    lines = ["Filtered out"]
    said = []
    if f.deadline_hours is not None:
        n = sum(1 for o in out if "deadline" in (o.why or ""))
        said.append(f"deadline {f.deadline_hours:g} h: {n} option(s) take longer")
    if f.budget is not None:
        n = sum(1 for o in out if "budget" in (o.why or ""))
        cur = f.budget_currency or result.common_currency
        conv = (
            f" = {_money(result.budget_common, result.common_currency)}"
            if cur != result.common_currency
            else ""
        )
        said.append(
            f"budget {_money(f.budget, cur)}{conv}: {n} option(s) cost more (spot at the top "
            "of its range)"
        )
    payoff = sum(1 for o in out if (o.why or "").startswith("does not pay off"))
    if payoff:
        said.append(f"{payoff} subscription(s) do not pay off for a run this short")
    for line in said:
        lines += _wrap(line, "  ", "  - ")
    limit = len(out) if show_all else 6
    for o in out[:limit]:
        lines += _wrap(f"{o.label} {o.provider} {_billing(o)}: {o.why}", "    ", "    ")
    if len(out) > limit:
        lines.append(f"    ... {len(out) - limit} more (--all, or --json)")
    lines.append("")
    return lines


def _section_time(result: SizingResult) -> list[str]:
    a = result.assumptions
    lines = ["How the time is estimated"]
    sources: dict[str, tuple[float, str]] = {}
    for o in result.options:
        if o.status != NO_FIT:
            sources.setdefault(o.gpu_model, (o.mfu, o.mfu_source))
    for gpu, (mfu, source) in sorted(sources.items()):
        lines += _wrap(f"{gpu}: MFU {mfu:.0%}, {source}", "  ", "  - ")
    scaling = ", ".join(
        f"{eff:g} on >= {gbps:g} Gbps between nodes" if gbps else f"{eff:g} on slower ones"
        for gbps, eff in a.scaling
    )
    lines += _wrap(
        "hours = FLOPs / (GPUs x dense peak in the chosen precision x MFU x scaling). One "
        "node: scaling 1 (the MFU is a whole node's). Several nodes: throughput kept per "
        f"doubling of the node count: {scaling}, counting the node's fastest fabric "
        "(InfiniBand, EFA, else its Ethernet) (estimates, sizing.toml).",
        "  ",
        "  ",
    )
    lines.append("")
    return lines


# ----------------------------------------------------------------------------------------------
# --write-stack


def stack_yaml(o: Option, result: SizingResult, name: str, today: dt.date) -> str:
    """A stacks/Pulumi.NAME.yaml for one option, with the sizing that chose it as comments."""
    cat = load_catalog()
    info = cat.providers[o.provider]
    tier = cat.tiers[o.tier]
    w = result.workload
    assert o.hours is not None
    from infra.config import MAX_TTL_HOURS

    wanted_ttl = max(tier.ttl_hours, math.ceil(o.hours * 1.25) + 1)
    ttl = min(wanted_ttl, MAX_TTL_HOURS)
    what = w.model or f"{_num(w.params)}-parameter model"
    lines = [
        f"# Written by scripts/size.py on {today.isoformat()}: {what}, {_num(w.tokens)} tokens,",
        f"# {w.precision} {w.optimizer} {w.strategy}"
        + (" + gradient checkpointing" if w.grad_checkpointing else "")
        + f". Chosen: {o.label} on {o.provider} ({o.instance_type}), {_billing(o)},",
        f"# about {_hours(o.hours)} h and {_money(o.cost, o.currency)}"
        + (" (an estimate: MFU not measured yet)." if not o.mfu_measured else "."),
        "# Before `pulumi up`: replace sshCidrs with your own network and set your key:",
        '#   pulumi config set gpufleet:sshPublicKey "$(cat ~/.ssh/id_ed25519.pub)" '
        f"--stack {name}",
        "config:",
        f"  gpufleet:provider: {o.provider}",
        f"  gpufleet:tier: {o.tier}",
    ]
    if o.nodes > 1:
        lines.append(f"  gpufleet:nodes: {o.nodes}")
    if o.billing != "on-demand":
        lines.append(f"  gpufleet:billing: {o.billing}")
    if o.billing == "subscription" and o.months:
        lines.append(f"  gpufleet:subscriptionMonths: {o.months}")
    lines += [
        f"  gpufleet:region: {info.default_region}",
        "  gpufleet:sshCidrs:",
        f"    - {DOC_CIDR}   # documentation range: put your office/VPN CIDR here",
    ]
    if ttl < wanted_ttl:
        lines.append(
            f"  gpufleet:ttlHours: {ttl}   # the longest TTL; the run needs ~{o.hours:,.0f} h: "
            "the TTL stops it, `fab train` resumes it from its checkpoint"
        )
    elif ttl != tier.ttl_hours:
        lines.append(f"  gpufleet:ttlHours: {ttl}   # the run's hours x 1.25: the TTL stops a run")
    return "\n".join(lines) + "\n"


def write_stack(
    result: SizingResult, name: str, row: int | None, stacks_dir: Path, force: bool
) -> tuple[Path, Option]:
    """Validate, then write; nothing is written when anything is wrong (UsageError)."""
    from infra.config import ConfigError, load_stack_file

    options = list(result.options)
    n = row or 1
    if n > len(options):
        raise UsageError([f"--row {n}: there are only {len(options)} options"])
    o = options[n - 1]
    if o.status != OK and not (o.status == FILTERED and row is not None and o.fits):
        raise UsageError(
            [
                f"--write-stack: option {n} ({o.label} on {o.provider}, {o.billing}) is not "
                f"usable: {o.why}"
                + ("; no option is left, loosen --deadline-hours or --budget" if n == 1 else "")
            ]
        )
    path = stack_file(name, stacks_dir)
    if path.exists() and not force:
        raise UsageError(
            [f"--write-stack: {path} exists: choose another name, or --force to replace it"]
        )
    text = stack_yaml(o, result, name, dt.date.today())
    with tempfile.TemporaryDirectory() as tmp:
        draft = Path(tmp) / path.name
        draft.write_text(text)
        try:
            load_stack_file(draft)
        except ConfigError as exc:
            raise UsageError(
                [f"--write-stack: the stack would be invalid: {p}" for p in exc.problems]
            ) from None
    stacks_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path, o


# ----------------------------------------------------------------------------------------------


def list_models() -> str:
    lines = [f"{'model':<13}{'params':>8}  {'shape':<30}source"]
    for key, spec in load_models().items():
        if spec.kind == "transformer":
            shape = f"{spec.layers}L h{spec.hidden} a{spec.heads} s{spec.seq_len}"
        else:
            shape = f"CNN, {spec.layers} layers, per image"
        lines.append(f"{key:<13}{_num(spec.params):>8}  {shape:<30}{spec.source}")
    return "\n".join(lines) + "\n"


def list_models_json() -> dict[str, Any]:
    """The built-in table for machines: every field of each model, unset ones as null."""
    return {"models": [dataclasses.asdict(spec) for spec in load_models().values()]}


def _print(text: str, out: TextIO) -> None:
    from rich.console import Console

    console = Console(
        file=out, width=WIDTH, markup=False, emoji=False, highlight=False, soft_wrap=True
    )
    console.print(text, end="")


def main(
    argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(join_negative_values(sys.argv[1:] if argv is None else argv))
        if args.list_models:
            if args.json:
                json.dump(list_models_json(), out, indent=1)
                out.write("\n")
            else:
                _print(list_models(), out)
            return 0
        problems: list[str] = []
        try:
            w = workload_from_args(args)
        except UsageError as exc:
            problems += exc.problems
        try:
            filters, currency, top, row = filters_from_args(args)
        except UsageError as exc:
            problems += exc.problems
        if problems:
            raise UsageError(problems)
        reports = REPORTS_DIR if args.reports is None else Path(args.reports)
        result = size(w, filters=filters, common_currency=currency, reports_dir=reports)
        written = None
        if args.write_stack is not None:
            written = write_stack(result, args.write_stack, row, Path(args.stacks_dir), args.force)
    except (UsageError, SizingError) as exc:
        for problem in exc.problems:
            print(fit(f"size.py: {problem}"), file=err)
        return 2
    except CatalogError as exc:
        print(fit(f"size.py: the catalog data is broken: {exc}"), file=err)
        return 1
    # nothing fits, or nothing is left: the report says why, and the status says "no"
    status = 0 if result.viable else 1
    if args.json:
        doc = result.to_json()
        if written:
            doc["written_stack"] = str(written[0])
        json.dump(doc, out, indent=1)
        out.write("\n")
        return status
    spec = load_models().get(w.model or "")
    alternative = None
    fix = best_fix(result)
    if fix is not None:
        try:
            alt = size(
                with_fix(w, fix),
                filters=filters,
                common_currency=currency,
                reports_dir=reports,
            )
        except SizingError:
            alt = None  # the fix meets the memory but not the deadline or budget: say nothing
        if alt is not None and alt.viable:
            alternative = (fix, alt)
    text = render(
        result,
        top=top,
        show_all=args.all,
        model_name=spec.name if spec else None,
        alternative=alternative,
    )
    _print(text, out)
    if written:
        path, o = written
        _print(
            f"\nWrote {path} ({o.label} on {o.provider}, {o.billing}). Next: "
            f"make plan STACK={args.write_stack}\n",
            out,
        )
    return status


if __name__ == "__main__":
    one_command()  # a one-shot command: no cyclic GC, none at exit (infra/short_lived.py)
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `size.py --json | head`: the reader has what it wanted
        # nothing buffered can be written: stdout to /dev/null, so the flush at exit is quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 0
    sys.exit(status)
