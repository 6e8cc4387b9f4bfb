"""Keeps every test away from the real ~/.ssh, cloud credentials and Pulumi state."""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import run_shared

_CLOUD_ENV = (
    "AWS_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "ALIBABA_CLOUD_ACCESS_KEY_ID",
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
    "ALICLOUD_ACCESS_KEY",
    "ALICLOUD_SECRET_KEY",
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_TENANT_ID",
    "AZURE_SUBSCRIPTION_ID",
    "IDENTITY_ENDPOINT",
    "IDENTITY_HEADER",
    "MSI_ENDPOINT",
    "GPUFLEET_AZURE_ACCESS_TOKEN",
    "PULUMI_ACCESS_TOKEN",
    "PULUMI_STACK",
    "PULUMI_CONFIG",
    "GPUFLEET_KNOWN_HOSTS",
    "GPUFLEET_INVENTORY",
    "XDG_CONFIG_HOME",
    # fab train's cache of what train-check learnt (bootstrap/train/check_cache.py)
    "XDG_CACHE_HOME",
    "GPUFLEET_CACHE_DIR",
)


def pytest_configure(config: pytest.Config) -> None:
    run_shared.start(config)  # what the xdist workers of this run make once and share
    # Bytecode is written during the run, whatever the shell says: with
    # PYTHONDONTWRITEBYTECODE=1 (as on CI's machines) every script, fab and plan the tests
    # start compiled the checkout's modules again, about 0.1 s of CPU per process, and each
    # xdist worker its test files. Set before the workers start, so they and every process
    # they start inherit it (docs/testing.md has the figures).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def pytest_unconfigure(config: pytest.Config) -> None:
    run_shared.finish(config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files with the most ``slow`` tests first, each file's tests in their order.

    The xdist workers take whole files in this order (``--dist loadfile``): begun last, the
    multi-node SSH files (minutes each) left one worker running for 47 s after the other two
    had finished (2026-12-03, three workers); begun first, the short files fill in the end."""
    # a parametrized slow test function counts once
    slow_functions = {
        (item.path, getattr(item, "originalname", item.name))
        for item in items
        if item.get_closest_marker("slow")
    }
    slow = Counter(path for path, _name in slow_functions)
    first_seen = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-slow[item.path], first_seen[item.path]))


@pytest.fixture(autouse=True)
def isolated_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    for name in _CLOUD_ENV:
        monkeypatch.delenv(name, raising=False)
    # Fake, obviously-not-real credentials so a stray client can never reach a real account.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # fab would otherwise ask EC2 for each aws node's console output (host keys): tests that
    # want it turn it on against their own moto server.
    monkeypatch.setenv("GPUFLEET_CONSOLE_HOST_KEYS", "0")
    # Azure's Retail Prices API needs no account, so only the URL keeps a test off it: a
    # closed port on loopback unless a test points it at its own fake.
    monkeypatch.setenv("GPUFLEET_AZURE_PRICES_URL", "http://127.0.0.1:9/api/retail/prices")
    yield home
