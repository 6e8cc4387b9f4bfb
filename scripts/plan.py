#!/usr/bin/env python3
"""Offline plan: evaluate the real Pulumi program for one stack under Pulumi's mocks.

No credentials, no network, no Pulumi CLI. Prints every resource with its key inputs, the
stack outputs and the hourly cost; `--json` prints one JSON object instead. Then runs the
guardrail policies (policy/, the same rules `pulumi preview --policy-pack policy/` runs) on the
resources the mocks recorded and prints their violations as `pulumi preview` does.

Exit status: 0 planned and no mandatory policy failed (advisories may be printed); 2 invalid
stack or policy config (one line per problem on stderr, nothing else); 3 planned, but a
mandatory policy failed (the plan is still printed, `pulumi up` would be refused).

    python scripts/plan.py --stack a100x4
    python scripts/plan.py --stack-file path/to/Pulumi.mystack.yaml --json
    python scripts/plan.py --stack t4x1 --policy-config policy-config.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout even before `pip install -e .`
    sys.path.insert(0, str(ROOT))

from infra.config import ConfigError, load_stack_file  # noqa: E402
from infra.short_lived import one_command  # noqa: E402
from infra.stackfiles import STACKS_DIR, StackNotFound, find_stack  # noqa: E402
from infra.usage import fit  # noqa: E402
from policy.rules import PolicyConfigError  # noqa: E402

STACKS = STACKS_DIR
EXIT_INVALID = 2


def resolve_stack_file(args: argparse.Namespace) -> Path:
    if args.stack_file is not None:
        if not args.stack_file.strip():
            raise ConfigError(["--stack-file '': give the path of a Pulumi.<stack>.yaml file"])
        return Path(args.stack_file)
    try:
        return find_stack(args.stack, STACKS)
    except StackNotFound as exc:
        raise ConfigError([f"--stack: {exc}"]) from None


def plan(
    path: Path, policy_config: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """(the plan as a JSON-able dict, notes for people). Raises ConfigError on bad config.

    `doc["policies"]` holds the guardrails' verdict (policy/plan_check.py `summary`)."""
    from infra.offline import PLACEHOLDER_SSH_KEY, evaluate
    from infra.program import OUTPUT_DOCS
    from policy.plan_check import check_plan, summary

    notes = []
    cfg = load_stack_file(path)
    if not cfg.ssh_public_key:
        cfg = load_stack_file(path, {"sshPublicKey": PLACEHOLDER_SSH_KEY})
        notes.append(
            "gpufleet:sshPublicKey is not set: planned with a placeholder key; "
            "`pulumi up` refuses until you set yours"
        )
    try:
        result = evaluate(cfg)
    except Exception as exc:
        # Pulumi re-raises what an Output's apply raised as a chain of ValueErrors; a
        # ConfigError somewhere in that chain is bad config found late (e.g. no zone in the
        # region offers the type), not a bug.
        cause = config_error_in(exc)
        if cause is None:
            raise
        raise cause from None
    doc = {
        "stack": cfg.stack,
        "stack_file": str(path),
        "stack_urn": result.stack_urn,
        "resources": [shown_inline_zips(r.to_json()) for r in result.resources],
        "outputs": result.outputs,
        "output_docs": OUTPUT_DOCS,
        "cost": result.outputs["hourly_cost"],
        "notes": notes,
        "policies": summary(check_plan(cfg, result, policy_config)),
    }
    doc["ttl"] = ttl_summary(cfg.ttl_hours)
    notes.append(doc["ttl"]["note"])
    if cfg.placement is not None:  # zone: auto: the candidates, the chosen one and why
        doc["placement"] = cfg.placement.to_json()
        notes.insert(0, cfg.placement.line())
    # What the cloud says about this stack (infra/clouds/base.py PlanNotes): its billing
    # mode's note before the bill's warnings; then what its program knows the stack needs
    # said (e.g. a disk it cannot keep), its catalog's notes and deadlines near their date.
    from infra.clouds.base import get_provider

    said = get_provider(cfg.provider).plan_notes(cfg, dt.date.today())
    notes.extend(said.billing)
    notes.extend(result.outputs["hourly_cost"].get("warnings", []))
    notes.extend(said.stack)
    return doc, notes


def ttl_summary(hours: float) -> dict[str, Any]:
    """What the hard TTL does to this stack's nodes, as the guards enforce it
    (gpufleet_node/idle_rules.py, on the node and in the cloud reaper): a plain line for the
    plan (at most 80 columns) and a note on how to change or extend it."""
    from gpufleet_node.idle_rules import MAX_LEASE_HOURS

    if hours <= 0:
        line = "TTL: off (gpufleet:ttlHours is 0): no node stops for its age; idle rules apply"
        note = (
            "with the TTL off only the idle rules stop a node: a job that keeps it busy runs "
            "(and bills) until it ends"
        )
    else:
        line = f"TTL: each node stops {hours:g} h after it boots, even mid-job (gpufleet:ttlHours)"
        note = (
            "the watchdog warns a running job 60 and 10 min before the TTL; "
            "`fab keep-alive --hours N` keeps a running node N hours from when it is run, "
            f"past the TTL too (N <= {MAX_LEASE_HOURS}); "
            "gpufleet:ttlHours: 0 turns the TTL off (idle rules still apply)"
        )
    return {
        "hours": hours if hours > 0 else None,
        "off": hours <= 0,
        "stops_even_if_busy": hours > 0,
        "lease_max_hours": MAX_LEASE_HOURS,
        "line": line,
        "note": note,
    }


def config_error_in(exc: BaseException) -> ConfigError | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ConfigError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def print_human(doc: dict[str, Any], notes: list[str]) -> None:
    """The plan as `pulumi preview` lays it out (infra/plan_view.py), fitted to the terminal,
    or unwrapped when piped. Plain text: nothing in it is read as markup."""
    from infra.plan_view import render_plan
    from infra.render import output_width
    from policy.plan_check import format_preview
    from policy.rules import Violation

    violations = [Violation(**v) for v in doc["policies"]["violations"]]
    sys.stdout.write(render_plan(doc, notes, format_preview(violations), output_width()))


def asset_json(value: Any) -> Any:
    """`json.dump`'s default for what the engine would receive as an asset or archive: shown
    as `pulumi preview --json` shows one, by where it is, its size and its digest, never its
    bytes (a file asset's path, size and sha256; an archive per member)."""
    kind = type(value).__name__
    if hasattr(value, "assets"):  # pulumi.AssetArchive
        return {kind: {name: asset_json(value.assets[name]) for name in sorted(value.assets)}}
    path = getattr(value, "path", None)
    if isinstance(path, str):  # FileAsset / FileArchive
        file = Path(path)
        if file.is_file():
            data = file.read_bytes()
            return {kind: {"path": path, "size": len(data), "sha256": _sha256(data)}}
        return {kind: {"path": path}}
    text = getattr(value, "text", None)
    if isinstance(text, str):  # StringAsset
        data = text.encode()
        return {kind: {"size": len(data), "sha256": _sha256(data)}}
    uri = getattr(value, "uri", None)
    if isinstance(uri, str):  # RemoteAsset / RemoteArchive
        return {kind: {"uri": uri}}
    return str(value)


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


# A zip handed to a provider inline, as base64 text (Alicloud's fc.V3Function code.zipFile):
# shown by its size and digest like an asset, not as 15 MB of text. "UEsDB" is the base64
# of a zip's first bytes, "PK\x03\x04"; shorter strings stay as they are.
INLINE_ZIP_PREFIX = "UEsDB"
INLINE_LIMIT = 4096


def shown_inline_zips(value: Any) -> Any:
    """The resource inputs with each inline base64 zip replaced by {"InlineZip": {size,
    sha256}} (the digest of the zip's bytes, as its file would have)."""
    if isinstance(value, dict):
        return {k: shown_inline_zips(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shown_inline_zips(v) for v in value]
    if isinstance(value, str) and len(value) > INLINE_LIMIT and value.startswith(INLINE_ZIP_PREFIX):
        import base64
        import binascii

        try:
            data = base64.b64decode(value, validate=True)
        except binascii.Error:
            return value
        return {
            "InlineZip": {"base64_chars": len(value), "size": len(data), "sha256": _sha256(data)}
        }
    return value


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag (the usage is in --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INVALID, fit(f"{self.prog}: {message} (see --help)") + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--stack", help="a stack in stacks/ (Pulumi.<stack>.yaml)")
    which.add_argument("--stack-file", help="any Pulumi.<stack>.yaml file")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument(
        "--policy-config",
        metavar="FILE",
        help="policy pack config, as for `pulumi preview --policy-pack-config` (JSON)",
    )
    args = parser.parse_args(argv)
    from policy.plan_check import EXIT_MANDATORY, load_pack_config

    try:
        if args.policy_config is not None and not args.policy_config.strip():
            raise PolicyConfigError("'': give the path of a policy pack config (JSON)")
        pack_config = load_pack_config(args.policy_config) if args.policy_config else None
        doc, notes = plan(resolve_stack_file(args), pack_config)
    except ConfigError as exc:
        for problem in exc.problems:
            print(fit(problem), file=sys.stderr)
        return EXIT_INVALID
    except PolicyConfigError as exc:
        print(fit(f"--policy-config: {exc}"), file=sys.stderr)
        return EXIT_INVALID
    try:
        if args.json:
            json.dump(doc, sys.stdout, indent=2, sort_keys=False, default=asset_json)
            sys.stdout.write("\n")
        else:
            print_human(doc, notes)
        sys.stdout.flush()
    except BrokenPipeError:  # `plan.py | head`: the reader has what it wanted
        # what is still buffered cannot be written: point stdout at /dev/null so the flush at
        # exit does not raise again (the recipe of Python's signal module documentation)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0 if doc["policies"]["passed"] else EXIT_MANDATORY


if __name__ == "__main__":
    one_command()  # a one-shot command: no cyclic GC, none at exit (infra/short_lived.py)
    sys.exit(main())
