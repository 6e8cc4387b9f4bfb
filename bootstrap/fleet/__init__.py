"""SSH and fleet plumbing every task is built on.

- :mod:`~bootstrap.fleet.api`: the step API (``@step``, ``StepResult``, ``Host``,
  ``HostContext``, ``Options``);
- :mod:`~bootstrap.fleet.cli`: ``fleet_task``, ``FleetExecutor``, ``resolve_fleet`` and
  ``fleet_run``, the glue between ``fab``'s command line and the runner;
- :mod:`~bootstrap.fleet.runner`: every host at once over SSH, progress and the summary;
- :mod:`~bootstrap.fleet.hosts`: which hosts (stack outputs, inventory, ``-H``);
- :mod:`~bootstrap.fleet.hostkeys` and :mod:`~bootstrap.fleet.console_keys`: pinned SSH
  host keys, from first use or the instance's console output;
- :mod:`~bootstrap.fleet.system`: shell helpers (``sh``, ``root_sh``, ``apt_get``) and the
  node probe (``preflight``, ``probe``).
"""
