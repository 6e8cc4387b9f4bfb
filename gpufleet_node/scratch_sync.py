"""The watchdog's scratch sync: every ``sync_dirs`` folder under scratch to
``<bucket>/<dir>/<node>/`` through the node cloud's bucket client (bucket.py).

Standard library only, beside watchdog.py in the node package (/opt/gpufleet/gpufleet_node/).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from . import bucket
from .clouds.base import Credentials
from .watchdog_config import Config, cloud_for

SyncResult = bucket.SyncResult


class Syncer(Protocol):
    """Saves scratch to the bucket (bucket.py); fakes in the tests."""

    def unsynced(self) -> int | None:
        """Checkpoint files on scratch that are not in the bucket; None when unknown."""
        ...

    def sync(self, timeout_s: float) -> SyncResult: ...


@dataclass
class ScratchSyncer:
    """The node's own sync: every ``sync_dirs`` under scratch -> <bucket>/<dir>/<node>/."""

    config: Config
    credentials: Callable[[], Credentials | None]
    retry_sleep: Callable[[float], None] = time.sleep

    def store(self) -> bucket.BucketStore | None:
        if not self.config.bucket:
            return None
        cloud = cloud_for(self.config)
        store = cloud.bucket_store.for_node(
            endpoint=cloud.bucket_endpoint(),
            region=self.config.region,
            bucket=self.config.bucket,
            credentials=self.credentials,
            endpoint_url=self.config.storage_endpoint_url,
        )
        store.retry_sleep = self.retry_sleep
        return store

    def unsynced(self) -> int | None:
        try:
            return len(
                bucket.pending(
                    Path(self.config.scratch_path),
                    self.config.sync_dirs,
                    self.config.node,
                    self.config.bucket,
                )
            )
        except OSError:
            return None

    def sync(self, timeout_s: float) -> SyncResult:
        return bucket.sync_scratch(
            scratch=Path(self.config.scratch_path),
            sync_dirs=self.config.sync_dirs,
            node=self.config.node,
            store=self.store(),
            timeout_s=timeout_s,
        )

    def check(self) -> str:
        store = self.store()
        if store is None:
            raise bucket.StoreError("no bucket configured: scratch cannot be saved", "NoBucket")
        return bucket.check_store(store, self.config.node)
