"""``fab verify-gpu`` and the node health check (``fab health``), by concern: the one tree
for both on the laptop (the node side is ``gpufleet_node/verify_*.py``).

- :mod:`~bootstrap.tasks.verify`: the ``verify-gpu`` task and its two steps (``verify-node``,
  ``verify-cross-node``);
- :mod:`~bootstrap.verify.ship`: copying the node-side files (``gpufleet_node/verify_*``)
  to a node, the command that runs them, fetching their report;
- :mod:`~bootstrap.verify.expected`: what a healthy node of the tier looks like;
- :mod:`~bootstrap.verify.judge` and :mod:`~bootstrap.verify.checks`: the pure judgement, one
  registered function per check; :mod:`~bootstrap.verify.verdict`: statuses and verdicts;
- :mod:`~bootstrap.verify.verdict_text` and :mod:`~bootstrap.verify.report`: tables, the saved
  JSON report and its upload;
- :mod:`~bootstrap.verify.health`: the node health check (its verdict, the check over SSH,
  fab train's gate on it); :mod:`~bootstrap.tasks.health` is its task.
"""
