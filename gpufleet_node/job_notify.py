"""Tell the person who walked away: one webhook message per event of a run (``--notify``).

Standard library only, Python 3.10+. The head node's supervisor (``job_runner.py``, node
rank 0 only, so one run sends one message per event) posts when an attempt ended and a
restart waits in its back-off, and when the run ended (succeeded, failed, cancelled, or its
budget reached). Each message says the job, what happened, why, the steps, time and spend,
and the ``fab`` commands to look closer.

Sending never blocks or fails the job: a worker thread posts, each message with a few
tries (a short timeout each, a back-off between), and what could not be sent is logged and
recorded as a ``notify`` event. The URL carries the webhook's token: it is a secret, so only
its host is ever logged, recorded or shown (:func:`host_of`).

The body is picked by the URL's host, from each service's documented payload (read
2026-12-05):

- Slack incoming webhooks (hooks.slack.com): a JSON POST whose ``text`` property is the
  message, https://api.slack.com/incoming-webhooks/
- Microsoft Teams (*.webhook.office.com: the Microsoft 365 connector's Incoming Webhook;
  *.logic.azure.com, *.powerautomate.com, *.powerplatform.com: a Workflows "when a Teams
  webhook request is received" flow): Workflows accept Adaptive Cards only ("Workflows
  support Adaptive Cards only",
  https://learn.microsoft.com/en-us/microsoftteams/platform/webhooks-and-connectors/how-to/connectors-using),
  and the connector's Incoming Webhook takes Adaptive Cards too, as a ``message`` with an
  ``application/vnd.microsoft.card.adaptive`` attachment ("Send Adaptive Cards using an
  Incoming Webhook",
  https://learn.microsoft.com/en-us/microsoftteams/platform/webhooks-and-connectors/how-to/add-incoming-webhook);
  one TextBlock card, with ``text`` beside it as well (the connector's plain form).
- Feishu / Lark custom bots (open.feishu.cn, open.larksuite.com, ``/open-apis/bot/v2/hook/``):
  ``{"msg_type": "text", "content": {"text": ...}}``,
  https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot and
  https://www.feishu.cn/hc/en-US/articles/360024984973
- DingTalk custom robots (oapi.dingtalk.com/robot/send?access_token=...):
  ``{"msgtype": "text", "text": {"content": ...}}``, UTF-8, at most 20 messages a minute per
  robot, https://open.dingtalk.com/document/group/custom-robot-access (the older page:
  https://open-doc.dingtalk.com/docs/doc.htm?treeId=257&articleId=105735&docType=1)
- anything else: a JSON object with the event's fields and ``text``.

Every message starts with ``gpufleet``: a Feishu or DingTalk bot whose security setting
is a keyword accepts the messages with the keyword ``gpufleet``. Signed bots (a secret
that signs each request) are not supported.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

# A few tries, each with a short timeout, a back-off between: a webhook that answers 500
# or never answers costs the worker at most TRIES * TIMEOUT_S + sum(BACKOFF_S) seconds per
# message, and the job nothing.
TRIES = 3
TIMEOUT_S = 5.0
BACKOFF_S = (1.0, 3.0)
# At the run's end the supervisor waits for unsent messages at most this long.
CLOSE_WAIT_S = TRIES * TIMEOUT_S + sum(BACKOFF_S) + 1.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")

_SERVICES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("slack", ("hooks.slack.com",)),
    ("teams", ("webhook.office.com", "logic.azure.com", "powerautomate.com", "powerplatform.com")),
    ("feishu", ("open.feishu.cn", "open.larksuite.com")),
    ("dingtalk", ("oapi.dingtalk.com",)),
)


def host_of(url: str) -> str:
    """The URL's host only: what may be shown of a webhook URL (its path or query holds
    the token)."""
    try:
        return (urllib.parse.urlsplit(str(url)).hostname or "").lower() or "?"
    except ValueError:
        return "?"


def check_url(url: str) -> str | None:
    """None when ``url`` can take the messages, else one line saying why (the URL itself
    is never repeated: it is a secret). https, or http only to this machine (tests)."""
    try:
        parts = urllib.parse.urlsplit(str(url))
        host = (parts.hostname or "").lower()
        _ = parts.port  # raises on a bad port
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("https", "http") or not host:
        return "give an https:// webhook URL"
    if parts.scheme == "http" and host not in LOOPBACK:
        return f"http://{host}: the webhook URL carries a token, use https"
    if parts.username or parts.password:
        return f"{parts.scheme}://{host}: no user or password in the URL"
    if any(c.isspace() for c in str(url)):
        return f"{parts.scheme}://{host}: spaces in the URL"
    return None


def service_of(url: str) -> str:
    """slack, teams, feishu, dingtalk or generic, by the URL's host."""
    host = host_of(url)
    for name, suffixes in _SERVICES:
        if any(host == s or host.endswith("." + s) for s in suffixes):
            return name
    return "generic"


def payload(service: str, text: str, fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The body one service accepts for ``text`` (see the module's sources)."""
    if service == "slack":
        return {"text": text}
    if service == "teams":
        card = {
            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
            "type": "AdaptiveCard",
            "version": "1.4",
            "body": [{"type": "TextBlock", "text": text, "wrap": True}],
        }
        attachment = {
            "contentType": "application/vnd.microsoft.card.adaptive",
            "contentUrl": None,
            "content": card,
        }
        return {"type": "message", "text": text, "attachments": [attachment]}
    if service == "feishu":
        return {"msg_type": "text", "content": {"text": text}}
    if service == "dingtalk":
        return {"msgtype": "text", "text": {"content": text}}
    return {**dict(fields or {}), "text": text}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not a place to send the job's message (nor its token)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _opener(url: str) -> urllib.request.OpenerDirector:
    handlers: list[Any] = [_NoRedirect()]
    if host_of(url) in LOOPBACK:
        handlers.append(urllib.request.ProxyHandler({}))  # never via a proxy to this machine
    return urllib.request.build_opener(*handlers)


def post(
    url: str,
    body: Mapping[str, Any],
    *,
    tries: int = TRIES,
    timeout: float = TIMEOUT_S,
    backoff: tuple[float, ...] = BACKOFF_S,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """POST ``body`` as JSON, at most ``tries`` times: {ok, tries, status, error}. A 2xx is
    sent; a 4xx other than 429 is not tried again (the same body would fail the same way).
    The error never holds the URL."""
    data = json.dumps(body, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json; charset=utf-8", "User-Agent": "gpufleet"}
    opener = _opener(url)
    out: dict[str, Any] = {"ok": False, "tries": 0, "status": None, "error": ""}
    for n in range(max(1, tries)):
        if n:
            sleep(backoff[min(n - 1, len(backoff) - 1)] if backoff else 0.0)
        out["tries"] = n + 1
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        try:
            with opener.open(request, timeout=timeout) as answer:
                answer.read(4096)
                out.update(ok=True, status=answer.status, error="")
                return out
        except urllib.error.HTTPError as exc:
            out.update(status=exc.code, error=f"HTTP {exc.code}")
            if 400 <= exc.code < 500 and exc.code != 429:
                return out
        except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections
            reason = getattr(exc, "reason", exc)
            out["error"] = str(reason).replace(url, host_of(url))[:200] or type(exc).__name__
    return out


def _amount(value: float, cap: float | None) -> str:
    """Cents, or four decimals where the budget is below one (a test's 0.004)."""
    return f"{value:.4f}" if cap is not None and float(cap) < 1 else f"{value:.2f}"


def message(event: Mapping[str, Any]) -> str:
    """One or two lines: the job, what happened and why, then the attempt's steps and time,
    the spend, and the ``fab`` commands to look closer."""
    job = str(event.get("job") or "?")
    name = str(event.get("name") or "")
    label = job if not name or name in job else f"{job} ({name})"
    what = str(event.get("what") or "")
    first = f"gpufleet job {label}: {what}"
    more = [str(event["attempt_line"])] if event.get("attempt_line") else []
    spent, cap = event.get("spent"), event.get("max_cost")
    if spent is not None:
        money = _amount(float(spent), cap) + (f" of {float(cap):g}" if cap else "")
        more.append(f"spent {money} {event.get('currency') or ''}".rstrip())
    more.append(f"look closer: fab logs {job}, fab jobs")
    return first + "\n" + "; ".join(more)


class Notifier:
    """Posts the run's messages in order from one worker thread; ``record`` gets each
    result (the supervisor's event log) and ``log`` a line for each one not sent."""

    def __init__(
        self,
        url: str,
        *,
        record: Callable[..., None],
        log: Callable[[str], None],
        tries: int = TRIES,
        timeout: float = TIMEOUT_S,
        backoff: tuple[float, ...] = BACKOFF_S,
    ) -> None:
        self.url = url
        self.host = host_of(url)
        self.service = service_of(url)
        self.record, self.log = record, log
        self.tries, self.timeout, self.backoff = tries, timeout, backoff
        self.pending: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.worker: threading.Thread | None = None

    def send(self, kind: str, **event: Any) -> None:
        """Queue one message (``kind``: attempt_end or run_end); returns at once."""
        if self.worker is None:
            self.worker = threading.Thread(target=self._work, name="gpufleet-notify", daemon=True)
            self.worker.start()
        self.pending.put({"kind": kind, **event})

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Let the queued messages go, waiting at most ``wait_s`` (the process may end
        after: the worker is a daemon)."""
        if self.worker is None:
            return
        self.pending.put(None)
        self.worker.join(timeout=max(0.0, wait_s))
        if self.worker.is_alive():
            self.log(f"notify: gave up waiting for {self.host} after {wait_s:g} s")

    def _work(self) -> None:
        while True:
            event = self.pending.get()
            if event is None:
                return
            with contextlib.suppress(Exception):  # a notification never fails the job
                self._deliver(event)

    def _deliver(self, event: Mapping[str, Any]) -> None:
        text = message(event)
        fields = {k: v for k, v in event.items() if k not in ("what", "attempt_line")}
        body = payload(self.service, text, fields)
        out = post(self.url, body, tries=self.tries, timeout=self.timeout, backoff=self.backoff)
        self.record(
            "notify",
            kind=event.get("kind"),
            host=self.host,
            service=self.service,
            ok=out["ok"],
            tries=out["tries"],
            status=out["status"],
            error=out["error"],
        )
        if not out["ok"]:
            self.log(
                f"notify: {event.get('kind')} not sent to {self.host} after {out['tries']} "
                f"tries: {out['error']}"
            )
