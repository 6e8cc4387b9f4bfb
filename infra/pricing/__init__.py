"""Pricing and sizing: what a stack costs and which tier fits a run, as plain arithmetic.

``price_sheet`` reads the price tables (pricing.toml and each cloud's [pricing]), ``cost``
turns a stack into its bill (and holds what a bill is made of), ``billing_modes`` is the one
list of billing modes and the rule that refuses one, ``compare`` sets a tier's offers
side by side and the catalog against a live price, ``sizing`` ranks every tier for a
run (``workload`` is the run, ``memory`` and ``speed`` its formulas).
No Pulumi and no provider SDK: plan, cost, size, gpus and the policy pack read it cheaply
(tests/infra/pricing/test_boundary.py holds it to that). Live prices, which need a cloud's
SDK, live with each cloud.
"""
