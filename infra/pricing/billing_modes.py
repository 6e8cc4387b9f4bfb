"""Billing modes: the one list of them and the one rule that says a mode cannot be used.

The stack config (infra/config.py), the cost model and the sizing filters all ask here, so
a wrong mode reads the same wherever it is given. Which modes a cloud sells is its catalog
file's data (``[provider] billing``), not a list kept here.
"""

from __future__ import annotations

from infra.catalog import Catalog, load_catalog
from infra.suggest import did_you_mean

BILLING_MODES = ("on-demand", "spot", "subscription")
# The PrePaid terms (months) the clouds that sell subscriptions accept.
SUBSCRIPTION_MONTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 24, 36)


def billing_problem(
    billing: str, provider: str | None = None, catalog: Catalog | None = None
) -> str | None:
    """Why `billing` cannot be used (on `provider`, where one is given), in one line that
    says the fix; None when it can."""
    if billing not in BILLING_MODES:
        return (
            f"{billing!r} is not a billing mode: use one of {', '.join(BILLING_MODES)}"
            + did_you_mean(billing, BILLING_MODES)
        )
    cat = catalog or load_catalog()
    info = cat.providers.get(provider or "")
    if info is None or billing in info.billing:
        return None
    others = [p for p, i in cat.providers.items() if billing in i.billing]
    elsewhere = f", or a cloud that sells it: {', '.join(others)}" if others else ""
    return f"{provider} sells no {billing} billing here: use {' or '.join(info.billing)}{elsewhere}"
