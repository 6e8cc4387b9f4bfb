"""Idle teardown: decide which managed GPU instances to stop, and stop them.

Imports no Pulumi: this package runs inside a cloud function (boto3 / Alicloud SDK only)
and as ``scripts/teardown.py`` on a laptop.
"""
