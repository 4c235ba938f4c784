"""Notifications over a webhook: generic JSON, or Slack's incoming-webhook shape.

The standard library's HTTP client, in a thread: a notification is one small POST, so
an HTTP dependency would buy nothing. The receiver's answer decides whether a retry
can help: 5xx, 429 and network errors are retryable; any other 4xx is not (the URL or
the payload is wrong, and sending it again changes nothing).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any, Literal, Protocol

from trainmedic.domain.notify import Notification, NotifyEvent
from trainmedic.errors import TrainmedicError

WebhookFormat = Literal["json", "slack"]

# A receiver's error body is quoted in the history, not stored whole.
_MAX_QUOTED = 300

_HEADLINES = {
    NotifyEvent.APPROVAL_NEEDED: "Approval needed",
    NotifyEvent.EFFECT_APPLIED: "Effect applied",
    NotifyEvent.JOB_STOPPED: "Job stopped",
    NotifyEvent.ESCALATED: "Escalated to a person",
    NotifyEvent.BREAKER_TRIPPED: "Breaker tripped: cluster back in monitor mode",
}


class NotifyError(TrainmedicError):
    """A notification was not delivered. `retryable`: whether sending it again may help."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class Notifier(Protocol):
    async def send(self, notification: Notification) -> str:
        """Deliver it; returns the receiver's short answer, raises NotifyError."""
        ...


def generic_payload(notification: Notification) -> dict[str, Any]:
    return notification.model_dump(mode="json")


def slack_payload(notification: Notification) -> dict[str, Any]:
    """Slack's incoming webhooks take `text` (mrkdwn) and optional `blocks`; `text` alone
    is what every Slack-compatible receiver (Mattermost, Rocket.Chat) also reads."""
    where = f"job {notification.job_id}" if notification.job_id else ", ".join(notification.nodes)
    lines = [
        f"*{_HEADLINES[notification.event]}* ({notification.cluster}, {where or 'cluster'})",
        notification.summary,
        f"incident `{notification.incident_id}`",
    ]
    if notification.action_hint:
        lines.append(notification.action_hint)
    return {"text": "\n".join(lines)}


class WebhookNotifier:
    def __init__(self, url: str, fmt: WebhookFormat = "json", timeout: float = 10.0) -> None:
        if not url.startswith(("https://", "http://")):
            raise ValueError("the webhook URL must start with https:// or http://")
        self._url = url
        self._format = fmt
        self._timeout = timeout

    def _post(self, body: bytes) -> str:
        request = urllib.request.Request(
            self._url,
            data=body,
            headers={"Content-Type": "application/json", "User-Agent": "trainmedic"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                answer = response.read(_MAX_QUOTED).decode("utf-8", "replace")
                return f"HTTP {response.status} {answer}".strip()
        except urllib.error.HTTPError as error:
            text = error.read(_MAX_QUOTED).decode("utf-8", "replace").strip()
            retryable = error.code >= 500 or error.code == 429
            raise NotifyError(
                f"webhook answered HTTP {error.code}: {text or error.reason}", retryable=retryable
            ) from error
        except (urllib.error.URLError, TimeoutError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise NotifyError(f"webhook unreachable: {reason}", retryable=True) from error

    async def send(self, notification: Notification) -> str:
        payload = (
            slack_payload(notification)
            if self._format == "slack"
            else generic_payload(notification)
        )
        body = json.dumps(payload).encode()
        return await asyncio.to_thread(self._post, body)
