"""Garbage collection for a command that does one bounded piece of work and exits.

An offline plan imports the provider SDKs (tens of thousands of classes, functions and
typing objects) and then declares a few dozen resources. Python's cyclic collector spends
much of that run walking those objects again and again, and once more, over all of them, as
the interpreter shuts down, to free memory the operating system is about to take back
anyway. Measured on an Azure plan (scripts/plan.py --stack azure-t4x1, CPU time of the
whole process, three runs each, 2026-12-03): 1.78-1.94 s as is, 1.32-1.51 s with only the
collection at exit skipped, 0.93-1.04 s with both; its peak memory stayed at 98-99 MB, as
the run makes little cyclic garbage.

:func:`one_command` is for scripts' ``__main__`` only, never for a library function: the
test suite calls the scripts' ``main()`` in one long process, which must keep collecting.
:func:`skip_exit_collection` is the part that is safe in a process that may run for hours
(``fab top``, ``fab logs --follow``), whose collector must keep running: only the last
collection goes, about 0.1-0.2 s of each ``fab`` (its start under :func:`no_collection`).

What is skipped is only that last collection: every ``atexit`` handler still runs
(temporary folders' finalizers among them; those registered later run before the freeze,
as handlers run last-registered first), and the interpreter flushes the standard streams
as usual. Cyclic garbage left at exit is not finalized; the code here closes its files and
connections itself (``with``), never through a collector's finalizer.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
from collections.abc import Iterator


def one_command() -> None:
    """No cyclic collection for the rest of this process, nor at its exit."""
    gc.disable()
    skip_exit_collection()


def skip_exit_collection() -> None:
    """No collection at this process's exit; the collector runs as usual until then."""
    # gc.freeze moves every tracked object to the permanent generation, which the
    # interpreter's final collection does not examine
    atexit.register(gc.freeze)


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """No cyclic collection inside the block (imports that build many objects), then the
    collector as it was before."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
