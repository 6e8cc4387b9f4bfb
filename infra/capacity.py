"""Is this failure the cloud running out of room? The capacity-error classifier (issue 25).

Each cloud's catalog.toml lists, under ``[[capacity_errors]]``, the error codes its create
call answers when there is no capacity for the type in that zone now (``capacity = true``:
another zone, type, region or cloud may succeed) and near misses that must stop a failover
(``capacity = false``: quotas, account limits), each with its source. :func:`classify` reads
an engine's error text (Pulumi prints the provider's error, code and message, inside its own
lines) and says which it is. An error that holds no listed code is not capacity: a failover
stops at once on what it does not know.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from infra.catalog import CatalogError, cloud_file, cloud_path, load_catalog, provider_names

_KEYS = frozenset({"code", "capacity", "source", "means", "when", "texts"})


@dataclass(frozen=True)
class CapacityCode:
    provider: str
    code: str
    capacity: bool
    source: str
    means: str
    when: str = ""  # a text the error must also hold for this code to count
    texts: tuple[str, ...] = ()  # texts that identify the code when it is not printed

    def found_in(self, text: str) -> bool:
        # The code as a whole token: 'OperationDenied' is not found in
        # 'OperationDenied.NoStock', but 'Server.InsufficientInstanceCapacity' holds its code.
        token = rf"(?<![\w-]){re.escape(self.code)}(?![\w-]|\.\w)"
        named = re.search(token, text) is not None
        if not named and not any(t.lower() in text.lower() for t in self.texts):
            return False
        return not self.when or self.when.lower() in text.lower()


@dataclass(frozen=True)
class Verdict:
    capacity: bool
    matched: tuple[CapacityCode, ...]
    reason: str  # one line for people: the code, the cloud, what it means, the source


def _parse(provider: str, rows: object, sources: Mapping[str, object]) -> list[CapacityCode]:
    where = f"{cloud_path(provider)} [[capacity_errors]]"
    if not isinstance(rows, list):
        raise CatalogError(f"{where}: must be an array of tables")
    out = []
    for i, row in enumerate(rows):
        extra = set(row) - _KEYS
        if extra:
            raise CatalogError(f"{where}[{i}]: unknown keys {sorted(extra)}")
        if not isinstance(row.get("capacity"), bool) or not row.get("code"):
            raise CatalogError(f"{where}[{i}]: code and capacity (true/false) are required")
        if row.get("source") not in sources:
            raise CatalogError(f"{where}[{i}]: unknown source {row.get('source')!r}")
        out.append(
            CapacityCode(
                provider=provider,
                code=str(row["code"]),
                capacity=row["capacity"],
                source=str(row["source"]),
                means=str(row.get("means", "")),
                when=str(row.get("when", "")),
                texts=tuple(str(t) for t in row.get("texts", ())),
            )
        )
    return out


@functools.lru_cache(maxsize=1)
def _all_codes() -> tuple[CapacityCode, ...]:
    sources = load_catalog().sources
    found: list[CapacityCode] = []
    for provider in provider_names():
        found += _parse(provider, cloud_file(provider).get("capacity_errors", []), sources)
    return tuple(found)


def codes(provider: str | None = None) -> tuple[CapacityCode, ...]:
    """Every cloud's listed codes (or one cloud's), in the catalog's order."""
    return tuple(c for c in _all_codes() if provider is None or c.provider == provider)


def classify(text: str, provider: str | None = None) -> Verdict:
    """Capacity when the error holds a capacity code (of ``provider``, or of any cloud) and
    no listed non-capacity code; otherwise not, with the reason."""
    matched = tuple(c for c in codes(provider) if c.found_in(text))
    stops = [c for c in matched if not c.capacity]
    if stops:
        c = stops[0]
        return Verdict(
            False, matched, f"not capacity: {c.code} ({c.provider}: {c.means}; {c.source})"
        )
    if matched:
        c = matched[0]
        return Verdict(True, matched, f"capacity: {c.code} ({c.provider}: {c.means}; {c.source})")
    where = f"{provider}'s" if provider else "any cloud's"
    return Verdict(False, (), f"not capacity: no capacity error code of {where} in the error")
