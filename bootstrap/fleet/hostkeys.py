"""Pin SSH host keys: trust on first use, then refuse any other key for that host.

Fabric (paramiko) on its own accepts whatever key a server presents and forgets it. Here every
connection goes through a known_hosts file that gpufleet keeps per stack:

- ``--known-hosts FILE`` on any fleet task, else ``$GPUFLEET_KNOWN_HOSTS``, else
  ``${XDG_CONFIG_HOME:-~/.config}/gpufleet/known_hosts/<stack>`` (``default`` when the hosts
  come from ``-H`` without a stack). OpenSSH format, so ``ssh -o UserKnownHostsFile=FILE``
  and ``ssh-keygen -R HOST -f FILE`` work on it; written atomically with mode 0600.
- A host the file does not know: its key is recorded and the run says so (trust on first use).
  A host whose stack outputs carry ``host_keys`` is pinned from them before the first
  connection, so even the first connection is checked.
- A known host presenting another key fails with both fingerprints, the file, and the exact
  commands to forget the old key; the other hosts carry on. Only ``--accept-new-host-key HOST``
  (for a node that was really replaced) re-pins, and only for the hosts it names.

Pure parts (key parsing, fingerprints, known_hosts lines and their merging, messages) are plain
functions; :class:`KnownHostsFile` does the locked, atomic file I/O; :class:`HostKeyCheck` is the
paramiko ``MissingHostKeyPolicy`` used for one host's connection.

Host-name matching follows paramiko's (exact names and ``|1|`` hashed names); wildcard and
negated patterns are kept in the file but never match. A key listed under ``@revoked`` is refused
for every host; ``@cert-authority`` lines are kept and ignored.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import hmac
import os
import re
import shlex
import stat
import struct
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import paramiko

from bootstrap.fleet.api import Host

KNOWN_HOSTS_ENV = "GPUFLEET_KNOWN_HOSTS"
DEFAULT_FILE_NAME = "default"  # hosts given with -H and no stack

T = TypeVar("T")


class HostKeyError(Exception):
    """A host whose key cannot be trusted; ``kind`` is what the per-host summary shows."""

    def __init__(
        self,
        message: str,
        *,
        kind: str = "host-key-mismatch",
        event: HostKeyEvent | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.event = event  # for --json: the presented and the expected fingerprints


class HostKeyFileError(HostKeyError):
    """The known_hosts file itself is unusable (unreadable, writable by others, ...)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="host-key-error")


# ---------------------------------------------------------------------------------------------
# Keys and fingerprints (pure)


def _ssh_string(blob: bytes, offset: int = 0) -> tuple[bytes, int]:
    """One SSH wire-format string (uint32 length + bytes) from ``blob`` at ``offset``."""
    if len(blob) < offset + 4:
        raise ValueError("truncated key blob")
    (length,) = struct.unpack(">I", blob[offset : offset + 4])
    end = offset + 4 + length
    if len(blob) < end:
        raise ValueError("truncated key blob")
    return blob[offset + 4 : end], end


@dataclass(frozen=True)
class PublicKey:
    """An SSH public key as known_hosts and ``*.pub`` files spell it: a type and a blob."""

    key_type: str
    blob: bytes

    @classmethod
    def parse(cls, text: str) -> PublicKey:
        """``"ssh-ed25519 AAAA... [comment]"``; ValueError with the reason when malformed."""
        fields = text.split()
        if len(fields) < 2:
            raise ValueError(f"expected 'TYPE BASE64 [COMMENT]', got {text.strip()!r}")
        return cls.from_fields(fields[0], fields[1])

    @classmethod
    def from_fields(cls, key_type: str, b64: str) -> PublicKey:
        try:
            blob = base64.b64decode(b64.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise ValueError(f"{key_type} key is not valid base64") from None
        # The blob names its own type first; a mismatch means a mangled or mislabelled key.
        inner, _ = _ssh_string(blob)
        if inner.decode("ascii", "replace") != key_type:
            raise ValueError(
                f"key labelled {key_type!r} holds a {inner.decode('ascii', 'replace')!r}"
            )
        return cls(key_type, blob)

    @classmethod
    def from_paramiko(cls, key: paramiko.PKey) -> PublicKey:
        return cls(key.get_name(), key.asbytes())

    def to_paramiko(self) -> paramiko.PKey:
        return paramiko.PKey.from_type_string(self.key_type, self.blob)

    @property
    def b64(self) -> str:
        return base64.b64encode(self.blob).decode("ascii")

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.blob)

    def __str__(self) -> str:
        return f"{self.key_type} {self.b64}"


def fingerprint(blob: bytes) -> str:
    """OpenSSH's ``SHA256:`` fingerprint (what ``ssh-keygen -lf`` and ``ssh`` print)."""
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")
    return f"SHA256:{digest}"


def fingerprints(keys: Iterable[PublicKey]) -> str:
    return ", ".join(f"{k.fingerprint} ({k.key_type})" for k in keys) or "none"


# ---------------------------------------------------------------------------------------------
# known_hosts lines (pure)


def host_alias(address: str, port: int) -> str:
    """The name a host is filed under: ``host`` on port 22, ``[host]:port`` otherwise.

    Lower case, as ``ssh`` looks names up, so the file serves ``ssh -o UserKnownHostsFile``.
    """
    name = address.strip().lower()
    return name if port == 22 else f"[{name}]:{port}"


def paramiko_name(host: Host) -> str:
    """The name paramiko looks the host up under (its own spelling, case kept)."""
    return host.address if host.port == 22 else f"[{host.address}]:{host.port}"


def pattern_matches(pattern: str, alias: str) -> bool:
    """Exact or ``|1|salt|hash`` (HashKnownHosts) match of one host field entry."""
    if pattern.startswith("|1|"):
        parts = pattern.split("|")
        if len(parts) != 4:
            return False
        try:
            salt = base64.b64decode(parts[2])
            expected = base64.b64decode(parts[3])
        except binascii.Error:
            return False
        mac = hmac.new(salt, alias.encode("utf-8"), hashlib.sha1).digest()
        return hmac.compare_digest(mac, expected)
    return pattern.lower() == alias


@dataclass(frozen=True)
class Entry:
    """One line of a known_hosts file, kept verbatim so a rewrite never loses a line."""

    text: str
    marker: str | None = None  # "@revoked", "@cert-authority"
    patterns: tuple[str, ...] = ()
    key: PublicKey | None = None  # None: blank, comment, or a line we cannot read

    def names(self, alias: str) -> bool:
        return self.key is not None and any(pattern_matches(p, alias) for p in self.patterns)


def parse_line(text: str) -> Entry:
    fields = text.split()
    if not fields or fields[0].startswith("#"):
        return Entry(text)
    marker = None
    if fields[0].startswith("@"):
        marker, fields = fields[0], fields[1:]
    if len(fields) < 3:
        return Entry(text, marker)
    try:
        key = PublicKey.from_fields(fields[1], fields[2])
    except ValueError:
        # An unreadable line is kept as it is and never matches (OpenSSH skips them too).
        return Entry(text, marker)
    return Entry(text, marker, tuple(fields[0].split(",")), key)


def parse_known_hosts(text: str) -> list[Entry]:
    return [parse_line(line) for line in text.splitlines()]


def render_known_hosts(entries: Iterable[Entry]) -> str:
    lines = [e.text for e in entries]
    return "\n".join(lines) + "\n" if lines else ""


def entry_for(alias: str, key: PublicKey) -> Entry:
    return Entry(f"{alias} {key}", None, (alias,), key)


def keys_for(entries: Iterable[Entry], alias: str) -> list[PublicKey]:
    """The keys pinned for ``alias`` (revoked keys excluded), in file order, no duplicates."""
    revoked = revoked_keys(entries)
    found: list[PublicKey] = []
    for e in entries:
        pinned = e.marker is None and e.key is not None and e.names(alias)
        if pinned and e.key not in revoked and e.key not in found:
            assert e.key is not None
            found.append(e.key)
    return found


def revoked_keys(entries: Iterable[Entry]) -> set[PublicKey]:
    """Keys under ``@revoked``: refused for every host in this file, whatever the pattern."""
    return {e.key for e in entries if e.marker == "@revoked" and e.key is not None}


@dataclass(frozen=True)
class Merge:
    """What adding one key for a host did to the file."""

    entries: list[Entry]
    outcome: str  # "added" | "present" | "conflict"
    existing: tuple[PublicKey, ...] = ()  # the pinned keys of that type, on conflict


def add_key(entries: Sequence[Entry], alias: str, key: PublicKey) -> Merge:
    """Pin ``key`` for ``alias`` unless it is already there; never replaces another key.

    Another key of the same type for the same host is a conflict (the caller decides: refuse,
    or replace only when told to). Keys of other types are added next to the existing ones.
    """
    pinned = keys_for(entries, alias)
    if key in pinned:
        return Merge(list(entries), "present")
    same_type = tuple(k for k in pinned if k.key_type == key.key_type)
    if same_type:
        return Merge(list(entries), "conflict", same_type)
    return Merge([*entries, entry_for(alias, key)], "added")


def forget_host(entries: Sequence[Entry], alias: str) -> tuple[list[Entry], list[PublicKey]]:
    """Drop ``alias`` from every line naming it (other names on a shared line stay)."""
    kept: list[Entry] = []
    removed: list[PublicKey] = []
    for e in entries:
        if e.marker is not None or not e.names(alias):
            kept.append(e)
            continue
        assert e.key is not None
        if e.key not in removed:
            removed.append(e.key)
        rest = tuple(p for p in e.patterns if not pattern_matches(p, alias))
        if rest:
            kept.append(Entry(f"{','.join(rest)} {e.text.split(None, 1)[1]}", None, rest, e.key))
    return kept, removed


def replace_keys(
    entries: Sequence[Entry], alias: str, keys: Sequence[PublicKey]
) -> tuple[list[Entry], list[PublicKey]]:
    """Pin exactly ``keys`` for ``alias``; returns the new lines and the keys that went away."""
    kept, removed = forget_host(entries, alias)
    return [*kept, *(entry_for(alias, k) for k in keys)], [k for k in removed if k not in keys]


# ---------------------------------------------------------------------------------------------
# Where the file lives, and which hosts --accept-new-host-key names (pure)


def stack_file_name(stack: str | None) -> str:
    """A file name for a stack (``org/project/stack`` becomes ``org_project_stack``)."""
    if not stack:
        return DEFAULT_FILE_NAME
    name = re.sub(r"[^A-Za-z0-9._-]", "_", stack.strip())
    return name.lstrip(".") or DEFAULT_FILE_NAME


def default_known_hosts_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME") or "~", ".config")
    return Path(base).expanduser() / "gpufleet" / "known_hosts"


def known_hosts_path(
    stack: str | None, *, option: str = "", env: Mapping[str, str]
) -> tuple[Path, str]:
    """(file, why this file): ``--known-hosts``, then ``$GPUFLEET_KNOWN_HOSTS``, then per stack."""
    if option:
        return Path(option).expanduser(), "--known-hosts"
    if env.get(KNOWN_HOSTS_ENV):
        return Path(env[KNOWN_HOSTS_ENV]).expanduser(), f"${KNOWN_HOSTS_ENV}"
    path = default_known_hosts_dir(env) / stack_file_name(stack)
    return path, f"stack {stack}" if stack else "hosts given with -H (no stack)"


def parse_selectors(value: str | Sequence[str]) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(s.strip() for s in items if s.strip())


def selector_matches(selector: str, host: Host) -> bool:
    """``--accept-new-host-key`` names a host by address, address:port, alias or node name."""
    wanted = selector.strip().lower()
    if "@" in wanted:
        wanted = wanted.rpartition("@")[2]  # user@host as typed for -H
    address = host.address.lower()
    forms = {address, f"{address}:{host.port}", host_alias(host.address, host.port)}
    if host.name:
        forms.add(host.name.lower())
    return wanted in forms


def unmatched_selectors(selectors: Iterable[str], hosts: Sequence[Host]) -> list[str]:
    return [s for s in selectors if not any(selector_matches(s, h) for h in hosts)]


def selector_for(host: Host) -> str:
    """How a mismatch message tells the person to name this host."""
    return host.address if host.port == 22 else f"{host.address}:{host.port}"


def forget_commands(host: Host, path: Path) -> tuple[str, str]:
    """The two ways to forget a host's pinned key: ``fab forget-host-key`` and ``ssh-keygen``."""
    target = f"{host.user}@{host.address}" if host.user else host.address
    if host.port != 22:
        target = f"{target}:{host.port}"
    fab = f"fab -H {shlex.quote(target)} forget-host-key --known-hosts {shlex.quote(str(path))}"
    keygen = (
        f"ssh-keygen -R {shlex.quote(host_alias(host.address, host.port))} "
        f"-f {shlex.quote(str(path))}"
    )
    return fab, keygen


def mismatch_message(
    host: Host,
    *,
    presented: PublicKey,
    expected: Sequence[PublicKey],
    path: Path,
    origin: str = "pinned",
    seen: str = "the host presented",
) -> str:
    """Both fingerprints, the file, and how to move on; ``seen`` says where the new key is from."""
    alias = host_alias(host.address, host.port)
    fab, keygen = forget_commands(host, path)
    return (
        f"HOST KEY MISMATCH for {alias}: expected {fingerprints(expected)} ({origin} in {path}), "
        f"but {seen} {presented.fingerprint} ({presented.key_type}). Not connecting: "
        "someone may be intercepting the connection, or the node was replaced. "
        "Only if you replaced this node: rerun with "
        f"--accept-new-host-key {shlex.quote(selector_for(host))}, or forget the old key with "
        f"`{fab}` (or `{keygen}`)."
    )


def mismatch_error(
    host: Host,
    *,
    presented: PublicKey,
    expected: Sequence[PublicKey],
    path: Path,
    origin: str = "pinned",
    seen: str = "the host presented",
) -> HostKeyError:
    message = mismatch_message(
        host, presented=presented, expected=expected, path=path, origin=origin, seen=seen
    )
    alias = host_alias(host.address, host.port)
    event = HostKeyEvent("mismatch", alias, presented, path, tuple(expected))
    return HostKeyError(message, event=event)


def revoked_message(host: Host, key: PublicKey, path: Path) -> str:
    return (
        f"host key {key.fingerprint} ({key.key_type}) presented by "
        f"{host_alias(host.address, host.port)} is marked @revoked in {path}: not connecting"
    )


# ---------------------------------------------------------------------------------------------
# The file (locked, atomic, 0600)


class KnownHostsFile:
    """A gpufleet known_hosts file; every change is a locked read-modify-write.

    The lock is ``flock`` on a hidden file next to it: it serialises the host threads of one
    run (each takes its own descriptor) as well as two ``fab`` runs at once. Writes go to a
    temporary file in the same directory and replace the old one, so a reader never sees half
    a file and a crash never leaves one.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def _check_mode(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise HostKeyFileError(
                f"{self.path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}): "
                "anyone could pin a key there. Fix it with "
                f"`chmod 600 {shlex.quote(str(self.path))}`"
            )

    def read(self) -> list[Entry]:
        self._check_mode()
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as exc:
            raise HostKeyFileError(f"cannot read known_hosts file {self.path}: {exc}") from None
        return parse_known_hosts(text)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            # 0700: the file names every host of the fleet, which is nobody else's business.
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            lock_path = self.path.parent / f".{self.path.name}.lock"
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise HostKeyFileError(f"cannot create known_hosts file {self.path}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _write(self, entries: Sequence[Entry]) -> None:
        # Write through a symlink to its target rather than replacing the link itself.
        target = self.path.resolve()
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.new.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(render_known_hosts(entries))
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def update(self, change: Callable[[list[Entry]], tuple[list[Entry], T]]) -> T:
        """Apply ``change`` (entries -> (new entries, result)) under the lock; write if changed."""
        with self._locked():
            before = self.read()
            after, result = change(before)
            if after != before:
                try:
                    self._write(after)
                except OSError as exc:
                    raise HostKeyFileError(f"cannot write {self.path}: {exc}") from None
            return result


# ---------------------------------------------------------------------------------------------
# Settings for one run, and what happened per host


@dataclass(frozen=True)
class HostKeySettings:
    """Which file, which hosts may be re-pinned, and the keys the stack outputs give."""

    path: Path
    source: str = ""
    accept: tuple[str, ...] = ()  # --accept-new-host-key selectors
    # address -> keys from the stack outputs' nodes[].host_keys
    stack_keys: Mapping[str, tuple[PublicKey, ...]] = field(default_factory=dict)

    def accepts(self, host: Host) -> bool:
        return any(selector_matches(s, host) for s in self.accept)

    def keys_from_stack(self, host: Host) -> tuple[PublicKey, ...]:
        return tuple(self.stack_keys.get(host.address, ()))


def resolve_settings(
    *,
    stack: str | None,
    known_hosts: str = "",
    accept: str | Sequence[str] = (),
    stack_keys: Mapping[str, Sequence[PublicKey]] | None = None,
    env: Mapping[str, str] | None = None,
) -> HostKeySettings:
    path, source = known_hosts_path(
        stack, option=known_hosts, env=os.environ if env is None else env
    )
    return HostKeySettings(
        path=path,
        source=source,
        accept=parse_selectors(accept),
        stack_keys={a: tuple(k) for a, k in (stack_keys or {}).items()},
    )


@dataclass(frozen=True)
class HostKeyEvent:
    """What the host-key check did for one host (shown per host and in ``--json``)."""

    status: str  # "recorded" | "pinned" | "replaced" | "matched" | "mismatch"
    alias: str
    key: PublicKey  # the key the host presented (or the stack outputs gave)
    path: Path
    previous: tuple[PublicKey, ...] = ()  # the keys pinned before: replaced, or expected
    origin: str = "connection"  # "connection" | "stack outputs"

    @property
    def noteworthy(self) -> bool:
        """Worth a line of its own (a mismatch has one already: the host's error)."""
        return self.status not in ("matched", "mismatch")

    @property
    def message(self) -> str:
        fp = f"{self.key.fingerprint} ({self.key.key_type})"
        if self.status == "recorded":
            return f"recorded host key {fp} for {self.alias} in {self.path} (first connection)"
        if self.status == "pinned":
            return f"pinned host key {fp} for {self.alias} from the stack outputs in {self.path}"
        if self.status == "replaced":
            return (
                f"replaced host key for {self.alias} in {self.path}: was "
                f"{fingerprints(self.previous)}, now {fp} (--accept-new-host-key, "
                f"from the {self.origin})"
            )
        if self.status == "mismatch":
            return (
                f"host key {fp} for {self.alias} does not match "
                f"{fingerprints(self.previous)} pinned in {self.path}"
            )
        return f"host key {fp} for {self.alias} matches {self.path}"

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "alias": self.alias,
            "key_type": self.key.key_type,
            "fingerprint": self.key.fingerprint,
            "known_hosts": str(self.path),
            "previous": [k.fingerprint for k in self.previous],
            "origin": self.origin,
        }


# ---------------------------------------------------------------------------------------------
# Checking connections


class HostKeyVerifier:
    """The host-key side of one fleet run: pins stack keys, then checks each connection."""

    def __init__(self, settings: HostKeySettings) -> None:
        self.settings = settings
        self.file = KnownHostsFile(settings.path)
        self._lock = threading.Lock()
        self._before_connect: dict[Host, HostKeyEvent | HostKeyError] = {}

    def prepare(self, hosts: Iterable[Host]) -> None:
        """Pin the stack outputs' keys of ``hosts`` (once per run, before any connection).

        Never raises: a host whose stack key conflicts with its pinned key, or a file that
        cannot be used, is remembered as that host's failure.
        """
        for host in hosts:
            keys = self.settings.keys_from_stack(host)
            if not keys:
                continue
            outcome: HostKeyEvent | HostKeyError | None
            try:
                outcome = self._pin_stack_keys(host, keys)
            except HostKeyError as exc:
                outcome = exc
            if outcome is not None:
                with self._lock:
                    self._before_connect[host] = outcome

    def _pin_stack_keys(self, host: Host, keys: Sequence[PublicKey]) -> HostKeyEvent | None:
        alias = host_alias(host.address, host.port)
        path = self.settings.path
        if self.settings.accepts(host):

            def swap(entries: list[Entry]) -> tuple[list[Entry], HostKeyEvent | None]:
                if keys_for(entries, alias) == list(keys):
                    return entries, None
                new, removed = replace_keys(entries, alias, keys)
                status = "replaced" if removed else "pinned"
                event = HostKeyEvent(status, alias, keys[0], path, tuple(removed), "stack outputs")
                return new, event

            return self.file.update(swap)

        def merge(entries: list[Entry]) -> tuple[list[Entry], HostKeyEvent | None]:
            added: list[PublicKey] = []
            for key in keys:
                m = add_key(entries, alias, key)
                if m.outcome == "conflict":
                    raise mismatch_error(
                        host,
                        presented=key,
                        expected=m.existing,
                        path=path,
                        seen="the stack outputs give",
                    )
                entries = m.entries
                if m.outcome == "added":
                    added.append(key)
            event = HostKeyEvent("pinned", alias, added[0], path, (), "stack outputs")
            return entries, event if added else None

        return self.file.update(merge)

    def check(self, host: Host) -> HostKeyCheck:
        with self._lock:
            before = self._before_connect.get(host)
        return HostKeyCheck(self, host, before)


class HostKeyCheck(paramiko.MissingHostKeyPolicy):
    """One host's connection: load its pinned keys into paramiko, decide on unknown ones.

    paramiko compares a presented key with the loaded ones itself (``BadHostKeyException`` on
    a mismatch, before authentication) and only calls :meth:`missing_host_key` for a host with
    no loaded key: that is where trust on first use, and ``--accept-new-host-key``, happen.
    """

    def __init__(
        self, verifier: HostKeyVerifier, host: Host, before: HostKeyEvent | HostKeyError | None
    ) -> None:
        self.verifier = verifier
        self.host = host
        self.alias = host_alias(host.address, host.port)
        self.error = before if isinstance(before, HostKeyError) else None
        self.event: HostKeyEvent | None = before if isinstance(before, HostKeyEvent) else None
        self._expected: list[PublicKey] = []

    @property
    def path(self) -> Path:
        return self.verifier.settings.path

    def install(self, client: paramiko.SSHClient) -> None:
        """Load this host's pinned keys and make this object the client's policy."""
        if self.error is not None:
            raise self.error
        entries = self.verifier.file.read()
        accepting = self.verifier.settings.accepts(self.host)
        stack = self.verifier.settings.keys_from_stack(self.host)
        # A host being re-pinned without stack keys is checked by nothing but missing_host_key,
        # which then records whatever it presents (that is what the person asked for).
        self._expected = [] if accepting and not stack else keys_for(entries, self.alias)
        known = client.get_host_keys()
        name = paramiko_name(self.host)
        for key in self._expected:
            known.add(name, key.key_type, key.to_paramiko())
        client.set_missing_host_key_policy(self)

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        presented = PublicKey.from_paramiko(key)
        settings = self.verifier.settings
        path = settings.path
        if settings.accepts(self.host):

            def repin(entries: list[Entry]) -> tuple[list[Entry], HostKeyEvent]:
                if presented in revoked_keys(entries):
                    raise HostKeyError(revoked_message(self.host, presented, path))
                before = keys_for(entries, self.alias)
                if before == [presented]:
                    return entries, HostKeyEvent("matched", self.alias, presented, path)
                new, removed = replace_keys(entries, self.alias, [presented])
                status = "replaced" if removed else "recorded"
                return new, HostKeyEvent(status, self.alias, presented, path, tuple(removed))

            self.event = self.verifier.file.update(repin)
            return

        def record(entries: list[Entry]) -> tuple[list[Entry], HostKeyEvent]:
            if presented in revoked_keys(entries):
                raise HostKeyError(revoked_message(self.host, presented, path))
            m = add_key(entries, self.alias, presented)
            if m.outcome == "conflict":
                # Another thread (or run) pinned a different key meanwhile: same refusal.
                raise mismatch_error(self.host, presented=presented, expected=m.existing, path=path)
            if m.outcome == "present":
                return m.entries, HostKeyEvent("matched", self.alias, presented, path)
            return m.entries, HostKeyEvent("recorded", self.alias, presented, path)

        self.event = self.verifier.file.update(record)

    def explain(self, exc: BaseException) -> BaseException:
        """Turn paramiko's ``BadHostKeyException`` into a message that says what to do."""
        if isinstance(exc, paramiko.BadHostKeyException):
            presented = PublicKey.from_paramiko(exc.key)
            stack = self.verifier.settings.keys_from_stack(self.host)
            origin = "from the stack outputs, pinned" if stack else "pinned"
            return mismatch_error(
                self.host,
                presented=presented,
                expected=self._expected or [PublicKey.from_paramiko(exc.expected_key)],
                path=self.path,
                origin=origin,
            )
        return exc

    def confirm(self, client: paramiko.SSHClient) -> HostKeyEvent:
        """The event for the report once connected (``matched`` when nothing was written)."""
        if self.event is not None:
            return self.event
        transport = client.get_transport()
        if transport is None:  # pragma: no cover - connect() succeeded, so there is one
            raise HostKeyError("connected without a transport", kind="host-key-error")
        presented = PublicKey.from_paramiko(transport.get_remote_server_key())
        self.event = HostKeyEvent("matched", self.alias, presented, self.path)
        return self.event
