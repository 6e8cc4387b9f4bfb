"""`make up` with failover: try a `zone: auto` stack's candidates until one has the GPUs.

The loop is plain Python over a small seam (:class:`Engine`): one call runs one update for
a given placement, one destroys, one refreshes after an interrupted update, one records the
placement in the stack's config. infra/automation.py is the real one (Pulumi's Automation
API); the tests drive the loop with a fake that fails as the engine reports it.

Each failed update's error text is classified by infra/capacity.py (each cloud's documented
codes, in its catalog.toml): capacity -> the next candidate, in the placement's order (zone,
sibling type, region, cloud); anything else -> stop at once, exit 1. Every attempt is
printed with its reason and appended to ``.gpufleet/<stack>-up.jsonl`` beside the stack file.

Multi-node stacks: a candidate is one zone for every node, and the zone is an input of each
node and its subnet that the clouds cannot change in place, so the next candidate's update
replaces nodes a partial success left in the previous zone; when no candidate succeeds, a
stack that held nothing before the run is destroyed (nothing left), and one that had landed
before is put back where it was (gpufleet:placement restored, one update there).
Ctrl-C: the attempt is logged as interrupted; the next run refreshes the state first and
finishes in that candidate before trying others.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from infra import capacity
from infra.clouds.availability import RESTRICTED, SOLD_OUT, NoSignal, ZoneSignal
from infra.placement import Candidate, Placement

LOG_DIR = ".gpufleet"
EXIT_LANDED, EXIT_ERROR, EXIT_ALL_OUT, EXIT_INTERRUPTED = 0, 1, 4, 130


class UpdateFailed(Exception):
    """An update the engine ended with an error; ``text`` is what it printed (code, stdout,
    stderr), the provider's error inside it."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


class Engine(Protocol):
    """What the loop needs from Pulumi: one stack's operations."""

    def update(self, candidate: Candidate) -> None:
        """Run one update with the stack placed at ``candidate``; UpdateFailed on an error."""

    def destroy(self) -> None: ...

    def refresh(self) -> None:
        """Bring the state in line with the cloud after an interrupted update."""

    def resource_count(self) -> int:
        """How many resources the stack's state holds (0: nothing deployed)."""

    def recorded(self) -> str | None:
        """gpufleet:placement in the stack's config, or None."""

    def record(self, key: str | None) -> None:
        """Set (or, with None, remove) gpufleet:placement in the stack's config."""


class NodeEngine(Protocol):
    """What `fab recover` needs from Pulumi (bootstrap/tasks/recover.py): one node's
    resources, by URN, refreshed and updated with nothing else targeted. infra/automation.py
    PulumiEngine is the real one."""

    def resources(self) -> list[Mapping[str, Any]]:
        """The state's resources (urn, type, parent, custom ...), as `pulumi stack export`."""

    def outputs(self) -> Mapping[str, Any]:
        """The stack's outputs (nodes, ssh_user, tier, scratch ...)."""

    def refresh_would_delete(self, urns: Sequence[str]) -> list[str]:
        """Those of ``urns`` the cloud no longer has (a targeted refresh preview; no write)."""

    def refresh_only(self, urns: Sequence[str]) -> dict[str, int]:
        """Refresh ``urns`` alone; what it did by operation (delete: dropped from the state)."""

    def preview_only(self, urns: Sequence[str]) -> dict[str, int]:
        """What updating ``urns`` and their dependents would do, by operation."""

    def update_only(self, urns: Sequence[str]) -> dict[str, int]:
        """Update ``urns`` and their dependents; by operation; UpdateFailed on an error."""


def log_path(stack_file: Path, stack: str) -> Path:
    return stack_file.parent / LOG_DIR / f"{stack}-up.jsonl"


@dataclass
class Log:
    path: Path
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)

    def write(self, **row: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        row = {"time": self.clock().isoformat(timespec="seconds"), **row}
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, sort_keys=True) + "\n")

    def last(self) -> dict[str, Any] | None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return None
        for line in reversed(lines):
            try:
                return dict(json.loads(line))
            except (ValueError, TypeError):
                continue  # a line cut short by a kill: the one before it stands
        return None


def _where(c: Candidate) -> str:
    zone = c.zone if c.zone and c.zone.startswith(c.region) else f"{c.region}/{c.zone or '-'}"
    return f"{c.provider} {zone} {c.instance_type}"


def _first_line(text: str, limit: int = 300) -> str:
    """The error's most telling line: the one holding a provider code, else the last."""
    lines = [" ".join(x.split()) for x in text.splitlines() if x.strip()]
    hit = next((x for x in lines if capacity.classify(x).matched), None)
    return (hit or (lines[-1] if lines else "no error text"))[:limit]


# (instance type, regions) -> the cloud's ZoneSignals (its availability.py live_zones)
LiveZones = Callable[[str, Sequence[str]], Sequence[ZoneSignal]]


def live_screen(
    candidates: Sequence[Candidate],
    signal_for: Callable[[str], LiveZones | None],
    say: Callable[[str], None] = print,
) -> dict[str, str]:
    """Candidate key -> why to skip it, from each cloud's own availability signal now: a
    zone the signal reports sold out or restricted to this account. A cloud without a signal,
    or whose signal fails, skips nothing (the update finds out)."""
    skip: dict[str, str] = {}
    wanted: dict[tuple[str, str], list[str]] = {}
    for c in candidates:
        regions = wanted.setdefault((c.provider, c.instance_type), [])
        if c.region not in regions:
            regions.append(c.region)
    failed: set[str] = set()
    for (provider, itype), regions in wanted.items():
        live_zones = signal_for(provider)
        if live_zones is None or provider in failed:
            continue
        try:
            signals = live_zones(itype, regions)
        except NoSignal as exc:  # asked once: the next type would fail the same way
            failed.add(provider)
            say(f"live signal of {provider}: {exc}; its candidates are tried as planned")
            continue
        state = {(z.region, z.zone): z for z in signals}
        for c in candidates:
            z = state.get((c.region, c.zone or ""))
            ours = c.provider == provider and c.instance_type == itype
            if ours and z is not None and z.state in (SOLD_OUT, RESTRICTED):
                words = f" ({z.detail})" if z.detail else ""
                skip[c.key] = f"live signal: {z.state}{words}"
    return skip


def quota_screen(
    candidates: Sequence[Candidate],
    ask: Callable[[Candidate], Sequence[Any]],
    say: Callable[[str], None] = print,
) -> dict[str, str]:
    """Candidate key -> why to skip it, from the account's own quota there now (``ask``:
    infra.preflight.quota_asker, each cloud's preflight quota check): a place whose quota for
    the stack's billing is short (a FAIL line) is skipped with the quota's words and the fix.
    A cloud whose quota cannot be asked (no credentials, an API error) skips nothing, said
    once; a place whose answer leaves the quota out is tried, said per place (the update
    finds out)."""
    from infra.preflight import FAIL, UNKNOWN

    skip: dict[str, str] = {}
    failed: set[str] = set()
    for c in candidates:
        if c.provider in failed:
            continue
        found = list(ask(c))
        short = [x for x in found if x.state == FAIL]
        if short:
            x = short[0]
            skip[c.key] = f"{x.name} short: {x.detail}" + (f"; fix: {x.fix}" if x.fix else "")
            continue
        unknown = [x for x in found if x.state == UNKNOWN]
        if any(x.name == "quota" for x in unknown):  # the cloud could not be asked at all
            failed.add(c.provider)
            x = next(x for x in unknown if x.name == "quota")
            say(f"quota of {c.provider}: {x.detail}; its candidates are tried as planned")
        elif unknown:  # this place's answer left the quota out: not known to be short
            say(f"quota at {_where(c)}: {unknown[0].detail}; tried as planned")
    return skip


def up(
    placement: Placement,
    engine: Engine,
    log: Log,
    say: Callable[[str], None] = print,
    skip: Mapping[str, str] | None = None,
) -> int:
    """Try the candidates in order (leaving out those ``skip`` names, with its reason);
    the exit status (EXIT_*)."""
    order: Sequence[Candidate] = placement.order()
    skip = skip or {}
    why: dict[str, str] = {}  # place -> why it was skipped or failed, for the last word
    for c in order:
        if c.key in skip:
            log.write(candidate=c.key, outcome="skipped", reason=skip[c.key])
            say(f"skip {_where(c)}: {skip[c.key]}")
            why[c.key] = f"skipped, {skip[c.key]}"
    order = [c for c in order if c.key not in skip]
    if not order:  # every place was skipped: nothing to try, nothing made
        say("every place was skipped, and why:")
        for c in placement.order():
            say(f"  {_where(c)}: {why[c.key]}")
        log.write(outcome="all-out", action="none", why=dict(why))
        return EXIT_ALL_OUT
    last = log.last()
    if last and last.get("outcome") in ("started", "interrupted"):  # Ctrl-C, or killed
        # The interrupted update may have left pending operations: refresh, then finish in
        # the same candidate before any other.
        say(f"the last up was interrupted in {last.get('candidate')}: refreshing, then finishing")
        engine.refresh()
        log.write(outcome="refreshed", candidate=last.get("candidate"))
        resume = [c for c in order if c.key == last.get("candidate")]
        order = [*resume, *[c for c in order if c.key != last.get("candidate")]]
    had = engine.resource_count() > 0
    before = engine.recorded()
    total = len(order)
    for n, cand in enumerate(order, 1):
        head = f"attempt {n}/{total} {_where(cand)}"
        say(f"{head}: updating")
        engine.record(cand.key)
        log.write(attempt=n, candidate=cand.key, outcome="started")
        try:
            engine.update(cand)
        except KeyboardInterrupt:
            log.write(attempt=n, candidate=cand.key, outcome="interrupted")
            say(f"{head}: interrupted; the next `make up` refreshes and finishes it here")
            return EXIT_INTERRUPTED
        except UpdateFailed as exc:
            verdict = capacity.classify(exc.text, cand.provider)
            detail = _first_line(exc.text)
            if not verdict.capacity:
                log.write(
                    attempt=n, candidate=cand.key, outcome="error", reason=verdict.reason,
                    error=detail,
                )  # fmt: skip
                say(f"{head}: stopped, {verdict.reason}")
                say(f"  {detail}")
                return EXIT_ERROR
            code = verdict.matched[0].code
            log.write(attempt=n, candidate=cand.key, outcome="capacity", code=code, error=detail)
            why[cand.key] = f"failed, {verdict.reason}"
            nxt = f"; next {_where(order[n])}" if n < total else ""
            say(f"{head}: {verdict.reason}{nxt}")
            continue
        log.write(attempt=n, candidate=cand.key, outcome="landed")
        say(f"{head}: landed (gpufleet:placement = {cand.key})")
        return EXIT_LANDED
    return _all_out(engine, log, say, had, before, placement, why)


def _all_out(
    engine: Engine,
    log: Log,
    say: Callable[[str], None],
    had: bool,
    before: str | None,
    placement: Placement,
    why: Mapping[str, str] | None = None,
) -> int:
    """No candidate had the capacity: leave nothing half-made, and say why each place was
    skipped or failed, in the order they came."""
    if why:
        say("every place, and why:")
        for c in placement.order():
            if c.key in why:
                say(f"  {_where(c)}: {why[c.key]}")
        log.write(outcome="places", why=dict(why))
    if not had:
        say("no candidate has capacity now: destroying what the attempts created")
        engine.destroy()
        engine.record(None)
        log.write(outcome="all-out", action="destroyed")
        say("nothing is left; try later, or allow more regions, types or clouds")
        return EXIT_ALL_OUT
    back = next((c for c in placement.candidates if c.key == before), None)
    if back is None:
        say("no candidate has capacity now, and the stack had landed outside them: as it is")
        log.write(outcome="all-out", action="none", placement=before)
        return EXIT_ALL_OUT
    say(f"no candidate has capacity now: putting the stack back in {_where(back)}")
    engine.record(back.key)
    try:
        engine.update(back)
    except UpdateFailed as exc:
        log.write(outcome="all-out", action="restore-failed", error=_first_line(exc.text))
        say(f"putting it back failed too: {_first_line(exc.text)}")
        return EXIT_ALL_OUT
    log.write(outcome="all-out", action="restored", candidate=back.key)
    return EXIT_ALL_OUT
