#!/usr/bin/env python3
"""Deploy a stack, failing over to the next candidate when a cloud has no capacity.

`make up STACK=name` runs the stack's update through Pulumi's Automation API (the Pulumi CLI
and the cloud's credentials needed, as for `pulumi up`). A `zone: auto` stack tries its
candidates in the plan's order (zone, sibling type, region, cloud: docs/placement.md) and
records where it landed in gpufleet:placement; a pinned stack is tried once. Every attempt
is printed with its reason and appended to stacks/.gpufleet/<stack>-up.jsonl. With --live,
each cloud's own availability signal (`where.py --live`) is asked first, and the zones it
reports sold out or restricted are skipped. With --quota, the account's own quota for the
stack is asked at each place (the preflight's quota check, `make preflight`), and places
where it is short are skipped with the quota's words and the fix. When no place lands, the
last lines say for each place why it was skipped or failed.

Exit status: 0 landed; 1 a non-capacity error (stopped at once); 2 invalid stack config
(one line per problem, nothing run); 4 no candidate had capacity (nothing half-made left);
130 interrupted (the next run refreshes and finishes).

    python scripts/up.py --stack a100x8
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout even before `pip install -e .`
    sys.path.insert(0, str(ROOT))

from infra.config import ConfigError, load_stack_file  # noqa: E402
from infra.stackfiles import STACKS_DIR, StackNotFound, find_stack  # noqa: E402
from infra.usage import OneLineParser, fit  # noqa: E402

EXIT_INVALID = 2
PROG = "up.py"


def main(argv: list[str] | None = None, engine_for: object = None) -> int:
    from infra import failover
    from infra.placement import Candidate, Placement

    ap = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", required=True, help="stack name (stacks/Pulumi.<name>.yaml)")
    ap.add_argument(
        "--live",
        action="store_true",
        help="first ask each cloud's availability signal and skip zones it reports sold out",
    )
    ap.add_argument(
        "--quota",
        action="store_true",
        help="first ask the account's quota at each place and skip those where it is short",
    )
    args = ap.parse_args(argv)
    try:
        path = find_stack(args.stack, STACKS_DIR, otherwise="")
        cfg = load_stack_file(path)
    except StackNotFound as exc:
        print(fit(f"{PROG}: --stack: {exc}"), file=sys.stderr)
        return EXIT_INVALID
    except ConfigError as exc:
        for problem in exc.problems:
            print(fit(problem), file=sys.stderr)
        return EXIT_INVALID
    placement = cfg.placement
    if placement is None:  # pinned: one candidate, nothing recorded
        only = Candidate(cfg.provider, cfg.region, cfg.zone, cfg.instance_type, cfg.profile, "", "")
        placement = Placement((only,), 0, "pinned by the stack")
    engine: failover.Engine
    if engine_for is None:
        from infra.automation import PulumiEngine

        engine = PulumiEngine(cfg.stack)
    else:
        engine = engine_for(cfg.stack)  # type: ignore[operator]
    if cfg.placement is None:
        engine = _NoRecord(engine)
    log = failover.Log(failover.log_path(path, cfg.stack))
    skip = failover.live_screen(placement.candidates, _signal) if args.live else {}
    if args.quota:
        from infra.preflight import quota_asker

        rest = [c for c in placement.candidates if c.key not in skip]
        skip = {**skip, **failover.quota_screen(rest, quota_asker(cfg))}
    try:
        return failover.up(placement, engine, log, skip=skip)
    except KeyboardInterrupt:  # outside an update (the loop handles one inside)
        log.write(outcome="interrupted", candidate=placement.choice.key)
        print("interrupted: the next `make up` refreshes and finishes", file=sys.stderr)
        return failover.EXIT_INTERRUPTED


def _signal(provider: str) -> Any:
    """The cloud's live_zones (its folder's availability.py), or None when it has none."""
    from infra import clouds

    if provider not in clouds.names("availability.py"):
        return None
    return clouds.module(provider, "availability").live_zones


class _NoRecord:
    """A pinned stack's engine: gpufleet:placement is only for zone: auto stacks."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.update = inner.update
        self.destroy = inner.destroy
        self.refresh = inner.refresh
        self.resource_count = inner.resource_count

    def recorded(self) -> str | None:
        return None

    def record(self, key: str | None) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
