"""The node health check, by concern (``fab health``; ``fab setup`` and ``fab verify-gpu`` run
it too, and ``fab train`` reads its verdict):

- :mod:`~bootstrap.verify.health.verdict`: a node's health verdict, judged on the laptop from
  the node's findings against infra/catalog/health.toml;
- :mod:`~bootstrap.verify.health.check`: the check over SSH (ship the node tool, judge its
  snapshot, keep the verdict on the node and in the bucket);
- :mod:`~bootstrap.verify.health.gate`: ``fab train``'s gate on that verdict.

The task is :mod:`bootstrap.tasks.health`; the node side is ``gpufleet_node/verify_health.py``;
verify-gpu's own hardware checks are :mod:`bootstrap.verify.checks.health`.
"""
