"""What every node cloud shares: the contract (NodeCloud), the metadata services of the
``/latest/meta-data/`` kind (TokenMetadata, MetadataNode), credentials from the environment,
the one SigV4 signer (bucket.py's), the bounded retry of an idempotent API call, the OS
power-off, and the registration a cloud module makes of its class (``register``).

Standard library only, like every node file. This module imports no cloud: each cloud's
node module (infra/clouds/<name>/node.py, shipped beside this one as ``<name>.py``) imports
this one and registers its class; the package (``clouds/__init__.py``) finds those modules
by listing the files.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar

from .. import bucket

UTC = bucket.UTC
LOG = logging.getLogger("gpufleet-watchdog")
LEASE_TAG_ATTEMPTS = 3  # fab keep-alive's CreateTags / TagResources, bounded


class TagsUnreadable(Exception):
    """The instance's tags could not be read; the message says why (logged and published)."""


Credentials = bucket.Credentials  # access_key_id, secret, token (may be "")
Metric = tuple[str, float, str]  # name, value, unit


class TokenMetadata:
    """A metadata service of the ``/latest/meta-data/`` kind. In token mode (``token_header``
    set) a session token from ``PUT /latest/api/token``, asked for ``ttl_s`` seconds in
    ``ttl_header``, goes with every read in ``token_header``; without one, plain GETs (each
    cloud class below says which).

    Reads that fail for the network raise (callers decide what an unreadable answer means);
    a 404 is ``None``, the service's way of saying "not here".
    """

    def __init__(
        self,
        base_url: str,
        token_header: str = "",
        ttl_header: str = "",
        ttl_s: int = 300,
        timeout: float = 2.0,
    ) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout
        self._token_header = token_header
        self._ttl_header = ttl_header
        self._ttl_s = ttl_s

    def get(self, path: str) -> str | None:
        headers = {}
        token = self._token()
        if token:
            headers[self._token_header] = token
        request = urllib.request.Request(f"{self.base}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return str(resp.read().decode())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def _token(self) -> str | None:
        if not self._token_header:
            return None  # a service without session tokens
        request = urllib.request.Request(
            f"{self.base}/latest/api/token",
            method="PUT",
            headers={self._ttl_header: str(self._ttl_s)},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return str(resp.read().decode())
        except (urllib.error.URLError, OSError):
            return None

    def read(self, path: str) -> str | None:
        """The stripped text at ``path``; None when it is absent, empty or unreachable."""
        try:
            text = self.get(path)
        except (urllib.error.URLError, OSError):
            return None  # no metadata service: nothing to act on
        return text.strip() if text and text.strip() else None

    def role_credentials(self, base: str, fields: tuple[str, str, str]) -> Credentials | None:
        """Temporary credentials of the instance's role, listed under ``base``; ``fields``
        are the document's names for the key id, the secret and the session token. None
        when there is no role, or its document is not an object with a key id."""
        try:
            role = (self.get(base) or "").strip().splitlines()
            if not role:
                return None
            doc = json.loads(self.get(base + role[0].strip()) or "{}")
        except (urllib.error.URLError, OSError, ValueError):
            return None
        key_id, secret, token = fields
        if not isinstance(doc, dict) or not doc.get(key_id):
            return None
        return {
            "access_key_id": str(doc[key_id]),
            "secret": str(doc.get(secret) or ""),
            "token": str(doc.get(token) or ""),
        }


def env_credentials(keys: tuple[str, str, str]) -> Credentials | None:
    """Credentials from the environment variables ``keys`` (key id, secret, token), if set."""
    key, secret, token = keys
    env = os.environ
    if not env.get(key):
        return None
    return {"access_key_id": env[key], "secret": env.get(secret, ""), "token": env.get(token, "")}


sigv4_headers = bucket.sigv4_headers  # one signer for metrics, tags and the bucket


def system_poweroff() -> None:
    # Instance-initiated shutdown: the stack sets its behaviour to "stop", never terminate.
    subprocess.run(["systemctl", "poweroff"], check=False)


#
# Everything this node knows about its cloud lives in one module per cloud, written in the
# cloud's folder (infra/clouds/<name>/node.py) and shipped here as clouds/<name>.py, whose
# class registers itself (@register) and is picked from clouds.CLOUDS by the config's
# "provider"; no other node file names a cloud (tests/infra/test_provider_knowledge.py fails
# if one does). Adding a cloud is adding that module to its folder, nothing else. It imports
# this package absolutely (from gpufleet_node.clouds.base import ...). The class must provide
# (NodeCloud):
#
#   Cls(region, endpoint_url="", metadata_url="")   endpoint_url overrides the cloud's API
#       (tags, metrics) and metadata_url its metadata service; both are for tests and
#       private endpoints, "" means the cloud's own.
#   name                          the provider's name, as the stack's config spells it
#   joined                        ClassVar: when the cloud joined (1, 2, ...): the order
#                                 messages list the clouds in (the next cloud: the next one)
#   instance_id()                 this instance's id from the metadata service, or None
#   env_credentials()             API credentials from the cloud's usual environment
#                                 variables, or None (they override the instance's role)
#   credentials()                 env_credentials(), else the instance role's temporary
#                                 credentials from the metadata service, else None
#   spot_notice()                 the spot/preemption notice (any non-empty text that
#                                 changes per notice), or None when there is none or it
#                                 cannot be read
#   instance_tags(id, creds)      this instance's own tags; raises TagsUnreadable, never
#                                 guesses ({} only when it has none). ``creds`` is a
#                                 callable, called only by a cloud whose tag read needs it
#   write_tag(id, key, value, creds)   set one tag on this instance (the lease); raises on
#                                 failure (urllib's errors: retry_idempotent retries 5xx/429)
#   put_metrics(id, metrics, creds)    publish [(name, value, unit)] as custom metrics
#                                 in names.NAMESPACE (fleet_names.py), dimension: the
#                                 instance id, with NO timestamp (the service stamps
#                                 them); raises
#   bucket_endpoint()             scheme://host of the bucket's API in region (the store
#                                 puts the bucket, or Azure's storage account, in front)
#   bucket_store                  ClassVar: the bucket.py client for the cloud's object
#                                 store (bucket.Store: S3 or compatible; bucket.BlobStore)
#   poweroff()                    stop this instance so that billing for its GPUs ends and
#                                 its disks stay (the watchdog calls it only after its sync)
#
# Credentials are {"access_key_id", "secret", "token"} (bucket.Credentials). Every
# network call is bounded by ``timeout``. The shared helpers in this module (TokenMetadata,
# sigv4_headers, alicloud_rpc_query, env_credentials, system_poweroff) may be reused, and a
# cloud whose metadata service speaks /latest/meta-data/ states its data in a MetadataNode
# subclass (addresses, token headers, role fields, spot path, environment variables).


class NodeCloud(Protocol):
    """One cloud, as the node sees it (see the comment above for each member's contract)."""

    name: ClassVar[str]
    joined: ClassVar[int]
    bucket_store: ClassVar[type[bucket.BucketStore]]

    def __init__(self, region: str, endpoint_url: str = "", metadata_url: str = "") -> None: ...

    def instance_id(self) -> str | None: ...
    def env_credentials(self) -> Credentials | None: ...
    def credentials(self) -> Credentials | None: ...
    def spot_notice(self) -> str | None: ...
    def instance_tags(
        self, instance_id: str, creds: Callable[[], Credentials | None]
    ) -> dict[str, str]: ...
    def write_tag(self, instance_id: str, key: str, value: str, creds: Credentials) -> None: ...
    def put_metrics(
        self, instance_id: str, metrics: Sequence[Metric], creds: Credentials
    ) -> None: ...
    def bucket_endpoint(self) -> str: ...
    def poweroff(self) -> None: ...


@dataclass
class MetadataNode:
    """What the clouds whose metadata service speaks ``/latest/meta-data/`` share (AWS,
    Alicloud, Tencent): this instance's id, its role's temporary credentials and the spot
    notice read there (:class:`TokenMetadata`), API keys from the environment. A subclass
    states only its data below, and the API calls that differ (tags, metrics, power-off).
    """

    region: str
    endpoint_url: str = ""
    metadata_url: str = ""
    timeout: float = 10.0
    metadata_base: ClassVar[str] = ""  # the service's own address
    token_header: ClassVar[str] = ""  # the session token's header; "" for plain GETs
    token_ttl_header: ClassVar[str] = ""  # the header that asks for a token's lifetime
    token_ttl_s: ClassVar[int] = 300
    instance_id_path: ClassVar[str] = "/latest/meta-data/instance-id"
    role_path: ClassVar[str] = ""  # lists the role; the role's name under it: its keys
    role_fields: ClassVar[tuple[str, str, str]] = ("", "", "")  # key id, secret, token
    spot_path: ClassVar[str] = ""  # the spot notice (404 while there is none)
    env_keys: ClassVar[tuple[str, str, str]] = ("", "", "")  # key id, secret, token
    # S3 and the S3-compatible OSS and COS: one client (bucket.Store), the cloud's endpoint.
    bucket_store: ClassVar[type[bucket.BucketStore]] = bucket.Store

    @property
    def metadata(self) -> TokenMetadata:
        return TokenMetadata(
            self.metadata_url or self.metadata_base,
            self.token_header,
            self.token_ttl_header,
            self.token_ttl_s,
        )

    def instance_id(self) -> str | None:
        return self.metadata.read(self.instance_id_path)

    def env_credentials(self) -> Credentials | None:
        return env_credentials(self.env_keys)

    def credentials(self) -> Credentials | None:
        return self.env_credentials() or self.metadata.role_credentials(
            self.role_path, self.role_fields
        )

    def spot_notice(self) -> str | None:
        return self.metadata.read(self.spot_path)


def retry_idempotent(
    call: Callable[[], None],
    attempts: int = LEASE_TAG_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
    transient: Callable[[Exception], bool] | None = None,
) -> None:
    """Run an idempotent API call (setting a tag, a stop), trying again when the API was
    slow, unreachable or throttled (5xx, 429), or raised what ``transient`` says will pass
    (an API's own throttling code); a refusal (other 4xx) is final. Each try builds and signs
    its request anew, so the Alicloud nonce never repeats. Bounded: ``attempts`` tries,
    2 s, 4 s, ... apart."""
    for attempt in range(attempts):
        try:
            call()
            return
        except urllib.error.HTTPError as exc:
            if not bucket.retryable_status(exc.code) or attempt == attempts - 1:
                raise
        except (urllib.error.URLError, TimeoutError, OSError):
            if attempt == attempts - 1:
                raise
        except Exception as exc:
            if transient is None or not transient(exc) or attempt == attempts - 1:
                raise
        sleep(2.0 * (attempt + 1))


_CloudT = TypeVar("_CloudT", bound=type)
_REGISTERED: dict[str, type[NodeCloud]] = {}


def register(cls: _CloudT) -> _CloudT:
    """Class decorator of a cloud module: this class is the cloud named ``cls.name``."""
    name = getattr(cls, "name", "")
    if not name or name in _REGISTERED:
        raise ValueError(f"node cloud {cls.__name__}: no name, or {name!r} taken twice")
    _REGISTERED[name] = cls
    return cls


def registered() -> dict[str, type[NodeCloud]]:
    """The clouds registered so far, by name, in the order they joined (``joined``)
    (clouds/__init__.py imports them all first)."""
    order = sorted(_REGISTERED.values(), key=lambda cls: (cls.joined, cls.name))
    return {cls.name: cls for cls in order}
