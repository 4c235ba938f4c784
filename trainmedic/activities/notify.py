"""The notify activity: deliver one notification, or say why it was not."""

from __future__ import annotations

from collections.abc import Collection

from temporalio import activity
from temporalio.exceptions import ApplicationError

from trainmedic.adapters.notify.webhook import Notifier, NotifyError
from trainmedic.domain.notify import Notification, NotifyEvent, NotifyResult


class NotifyActivities:
    def __init__(
        self, notifier: Notifier | None, events: Collection[NotifyEvent] | None = None
    ) -> None:
        self._notifier = notifier
        self._events = set(events) if events else set(NotifyEvent)

    @activity.defn(name="notify")
    async def notify(self, notification: Notification) -> NotifyResult:
        if self._notifier is None:
            return NotifyResult(delivered=False, detail="no notifier configured")
        if notification.event not in self._events:
            return NotifyResult(
                delivered=False, detail=f"{notification.event.value} not subscribed"
            )
        try:
            answer = await self._notifier.send(notification)
        except NotifyError as error:
            if error.retryable:
                raise
            raise ApplicationError(str(error), type="NotifyError", non_retryable=True) from error
        activity.logger.info(
            "notified %s for %s", notification.event.value, notification.incident_id
        )
        return NotifyResult(delivered=True, detail=answer)
