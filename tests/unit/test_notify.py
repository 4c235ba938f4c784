"""Notifications: the webhook adapter and the notify activity against a local HTTP server.

The receiver is a real HTTP server on loopback (the standard library's), answering what
each test scripts: success, a receiver error (retryable), a bad URL (not retryable).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from trainmedic.activities.notify import NotifyActivities
from trainmedic.adapters.notify.webhook import NotifyError, WebhookNotifier
from trainmedic.config import Settings
from trainmedic.domain import Outcome
from trainmedic.domain.notify import Notification, NotifyEvent


class Receiver:
    """Answers each POST with the next scripted status (the last one repeats)."""

    def __init__(self) -> None:
        self.statuses = [200]
        self.bodies: list[dict[str, object]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                receiver.bodies.append(json.loads(self.rfile.read(length)))
                status = (
                    receiver.statuses.pop(0) if len(receiver.statuses) > 1 else receiver.statuses[0]
                )
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"no such hook")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    thread = threading.Thread(target=r.server.serve_forever, daemon=True)
    thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()


def note(event: NotifyEvent = NotifyEvent.APPROVAL_NEEDED) -> Notification:
    return Notification(
        event=event,
        incident_id="incident-lab-42-1",
        cluster="lab",
        job_id="42",
        nodes=["gpu02"],
        summary="waiting for approval to drain gpu02: gpu_hardware (Xid 79)",
        action_hint="trainmedic incidents approve incident-lab-42-1 --action drain-gpu02 --by me",
        at=datetime(2026, 12, 1, tzinfo=UTC),
    )


async def test_generic_json_carries_the_whole_notification(receiver: Receiver) -> None:
    answer = await WebhookNotifier(receiver.url).send(note())
    assert answer.startswith("HTTP 200")
    [body] = receiver.bodies
    assert body["event"] == "approval_needed" and body["incident_id"] == "incident-lab-42-1"
    assert body["nodes"] == ["gpu02"] and "--action drain-gpu02" in str(body["action_hint"])


async def test_slack_format_is_one_readable_text(receiver: Receiver) -> None:
    await WebhookNotifier(receiver.url, "slack").send(note(NotifyEvent.BREAKER_TRIPPED))
    [body] = receiver.bodies
    assert set(body) == {"text"}
    text = str(body["text"])
    assert text.startswith("*Breaker tripped") and "job 42" in text
    assert "`incident-lab-42-1`" in text


async def test_receiver_errors_say_whether_a_retry_can_help(receiver: Receiver) -> None:
    notifier = WebhookNotifier(receiver.url, timeout=5)
    receiver.statuses = [503]
    with pytest.raises(NotifyError, match="HTTP 503") as busy:
        await notifier.send(note())
    assert busy.value.retryable
    receiver.statuses = [404]
    with pytest.raises(NotifyError, match="HTTP 404: no such hook") as wrong:
        await notifier.send(note())
    assert not wrong.value.retryable


async def test_an_unreachable_receiver_is_retryable() -> None:
    with pytest.raises(NotifyError, match="unreachable") as error:
        await WebhookNotifier("http://127.0.0.1:9/hook", timeout=2).send(note())
    assert error.value.retryable


def test_only_http_urls() -> None:
    with pytest.raises(ValueError, match="https://"):
        WebhookNotifier("file:///etc/passwd")


async def test_activity_without_a_notifier_says_so_and_sends_nothing() -> None:
    result = await ActivityEnvironment().run(NotifyActivities(None).notify, note())
    assert not result.delivered and result.detail == "no notifier configured"


async def test_activity_sends_only_subscribed_events(receiver: Receiver) -> None:
    activities = NotifyActivities(WebhookNotifier(receiver.url), [NotifyEvent.ESCALATED])
    skipped = await ActivityEnvironment().run(activities.notify, note())
    sent = await ActivityEnvironment().run(activities.notify, note(NotifyEvent.ESCALATED))
    assert not skipped.delivered and "not subscribed" in skipped.detail
    assert sent.delivered and [b["event"] for b in receiver.bodies] == ["escalated"]


async def test_activity_fails_fast_on_a_wrong_url_and_retries_a_busy_receiver(
    receiver: Receiver,
) -> None:
    activities = NotifyActivities(WebhookNotifier(receiver.url))
    receiver.statuses = [404]
    with pytest.raises(ApplicationError) as wrong:
        await ActivityEnvironment().run(activities.notify, note())
    assert wrong.value.non_retryable and wrong.value.type == "NotifyError"
    receiver.statuses = [500]
    with pytest.raises(NotifyError):  # left to Temporal's retry policy
        await ActivityEnvironment().run(activities.notify, note())


def test_settings_check_the_url_and_the_events() -> None:
    with pytest.raises(ValueError, match="notify_webhook_url"):
        Settings(notify_webhook_url="ftp://example.org/hook")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown event pager"):
        Settings(notify_events="escalated,pager")
    ok = Settings(notify_webhook_url="https://hooks.example.org/x", notify_events="escalated")  # type: ignore[arg-type]
    assert "hooks.example.org" not in repr(ok), "the URL may carry a token: never printed"


async def test_a_busy_receiver_neither_loses_the_news_nor_holds_recovery_up(
    receiver: Receiver, time_skipping_env: WorkflowEnvironment
) -> None:
    """The real activity in the real workflow: two 503s, then the receiver takes it."""
    from tests.unit.test_workflows_time_skipping import AUTO, Behaviour, run_incident_result

    receiver.statuses = [503, 503, 200]
    result = await run_incident_result(
        time_skipping_env.client, AUTO, Behaviour(webhook=receiver.url, runs_again=False)
    )
    assert result.outcome is Outcome.ESCALATED
    events = [b["event"] for b in receiver.bodies]
    # Effects go on while the receiver is busy; each notification arrives once it answers.
    assert set(events) == {"effect_applied", "escalated"}
    assert len(receiver.bodies) == 2 + 3, events  # two refusals, then three deliveries


async def test_a_receiver_that_is_gone_does_not_stop_recovery(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    from tests.unit.test_workflows_time_skipping import AUTO, Behaviour, run_incident_result

    result = await run_incident_result(
        time_skipping_env.client, AUTO, Behaviour(webhook="http://127.0.0.1:9/hook")
    )
    assert result.outcome is Outcome.RECOVERED, result.summary
