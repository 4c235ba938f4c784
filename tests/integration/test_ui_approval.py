"""An operator approves a waiting incident in the Temporal UI itself, in a real browser.

Headless Chromium (Debian's `chromium`, driven by Playwright through `executable_path`:
Playwright's own browser download needs a network the tests do not have) opens an
approve-mode incident in the dev server's UI, reads the pending decision in Current
Details, sends the `approve` signal with its JSON payload through "More Actions -> Send a
Signal", and the incident goes on: drained, requeued, recovered, and the audit marks the
approval `unverified_identity` (the UI sends no identity). Screenshots of each step are
saved under the test's tmp_path, which the test prints.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from tests.integration.support import (
    effect_awaiting_approval,
    node,
    result_of,
    unique_cluster,
    xid79_incident,
)
from trainmedic.audit import export
from trainmedic.domain import Outcome
from trainmedic.lab import Lab
from trainmedic.temporal.devserver import DevServer

pytestmark = pytest.mark.integration

APPROVE = (
    "version: it-ui\nmode: {default: approve}\n"
    "approval: {timeout: 10m, fallback: escalate}\n"
    "verify: {timeout: 90s, poll_interval: 1s}\n"
)
# The UI is a single-page app on a loaded 2-core machine: be patient, never race it.
UI_TIMEOUT_MS = 60_000
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser")


def _unavailable(reason: str) -> None:
    """Skip where the browser cannot run, or fail where it must (as the lab fixtures do)."""
    if os.environ.get("TRAINMEDIC_REQUIRE_LAB") == "1":
        pytest.fail(f"TRAINMEDIC_REQUIRE_LAB=1 but the browser test cannot run: {reason}")
    pytest.skip(reason)


def chromium() -> str:
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    _unavailable(
        "Debian's chromium is not installed (`make install` installs it as root: "
        "deploy/lab/install-deps.sh)"
    )
    raise AssertionError("unreachable")


def launch_args() -> list[str]:
    # Chromium refuses to start as root unless its sandbox is off: the sandbox drops
    # privileges through user namespaces, which root in a container (CI: a fresh Debian
    # machine, as root) does not get. The page is our own dev server's UI on loopback.
    return ["--no-sandbox"] if os.geteuid() == 0 else []


async def signals_in_history(client: Client, incident: str, name: str) -> list[Any]:
    history = await client.get_workflow_handle(incident).fetch_history()
    return [
        e.workflow_execution_signaled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == name
    ]


async def test_operator_approves_in_the_temporal_ui(
    clean_lab: Lab,
    temporal_client: Client,
    temporal_server: DevServer,
    controller: Worker,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    executable = chromium()
    try:
        from playwright.async_api import async_playwright, expect
    except ImportError:
        _unavailable("playwright is not installed (`make install` installs the dev extra)")
        raise

    shots = tmp_path / "screenshots"
    shots.mkdir()
    with capsys.disabled():
        print(f"\nscreenshots of the UI approval: {shots}")

    cluster = unique_cluster("ui")
    incident, _, culprit = await xid79_incident(temporal_client, clean_lab, cluster, APPROVE)
    effect = await effect_awaiting_approval(temporal_client, incident)
    assert effect == f"drain-{culprit}"
    # "all": the drain and the requeue after it (in approve mode each effect waits for
    # its own approval; naming `effect` would approve the drain alone).
    payload = {"action": "all", "by": "alice@ui", "comment": "Xid 79: drain it, requeue"}

    url = f"{temporal_server.ui_url}/namespaces/{temporal_client.namespace}/workflows/{incident}"
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=executable, args=launch_args(), headless=True
        )
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(UI_TIMEOUT_MS)
            expect.set_options(timeout=UI_TIMEOUT_MS)
            await page.goto(url)
            await expect(page.get_by_role("heading", name=incident)).to_be_visible()

            # 1. The pending decision: Current Details sit under "User Metadata".
            await page.get_by_role("tab", name="User Metadata").click()
            # The UI renders them as markdown in a sandboxed frame of their own.
            current = page.frame_locator("iframe").first
            await expect(current.get_by_text("waiting for approval to drain")).to_be_visible()
            text = await current.locator("body").inner_text()
            assert f"waiting for approval to drain {culprit}" in text, text
            assert "Xid 79" in text and "approve" in text and "reject" in text, text
            # The effect to name in the payload's "action" is spelled out there.
            assert effect in text, text
            await page.screenshot(path=shots / "1-pending-decision.png", full_page=True)

            # 2. More Actions -> Send a Signal: the picker lists the workflow's signals
            # (from its metadata query, so only while a worker runs).
            await page.get_by_role("button", name="More Actions").click()
            await page.get_by_role("menuitem", name="Send a Signal").click()
            dialog = page.get_by_role("dialog")
            await expect(dialog).to_be_visible()
            # The picker's button has no name of its own (its label names a hidden input).
            await dialog.get_by_test_id("signal-select-button").click()
            options = dialog.get_by_role("option")
            await expect(options.filter(has_text="approve")).to_be_visible()
            names = [n.strip() for n in await options.all_inner_texts()]
            assert {"approve", "reject", "report"} <= set(names), names
            await options.filter(has_text="approve").click()

            # The Data editor takes one JSON payload; inserted as text, not typed key by
            # key, so the editor's bracket auto-closing adds nothing.
            editor = dialog.get_by_role("textbox", name="Data")
            await editor.click()
            await page.keyboard.insert_text(json.dumps(payload))
            await dialog.get_by_label("json/plain").check()
            await page.screenshot(path=shots / "2-send-a-signal.png", full_page=True)

            # The editor reformats the JSON when it loses focus, and the first click on
            # Submit may only do that: submit until the dialog closes.
            submit = dialog.get_by_role("button", name="Submit")
            for _ in range(3):
                await submit.click()
                try:
                    await expect(dialog).to_be_hidden(timeout=10_000)
                    break
                except AssertionError:
                    # Sent but slow to close: another click would send it twice.
                    if await signals_in_history(temporal_client, incident, "approve"):
                        break
            await expect(dialog).to_be_hidden()

            # 3. The signal is in the history, with the payload as sent and no identity.
            for _ in range(100):
                sent = await signals_in_history(temporal_client, incident, "approve")
                if sent:
                    break
                await asyncio.sleep(0.3)
            assert len(sent) == 1, sent
            decoded = temporal_client.data_converter.payload_converter.from_payloads(
                list(sent[0].input.payloads)
            )
            assert decoded == [payload], decoded
            assert sent[0].identity == ""

            # 4. The incident goes on: drained, requeued, the job runs again.
            result = await result_of(temporal_client, incident)
            assert result.outcome is Outcome.RECOVERED, result.summary
            assert "DRAIN" in node(clean_lab, culprit)["State"]

            # 5. What the operator sees afterwards: the incident completed, and the signal
            # in its Event History with the payload as sent.
            await page.reload()
            await expect(page.get_by_text("Completed", exact=True).first).to_be_visible()
            await page.get_by_role("tab", name="Event History").click()
            signaled = page.get_by_text("Workflow Execution Signaled").first
            await expect(signaled).to_be_visible()
            await page.screenshot(path=shots / "3-completed.png")
            await signaled.scroll_into_view_if_needed()
            await signaled.click()  # expands the event: its signal name and input
            expanded = page.get_by_role("row").filter(has_text="alice@ui")
            await expect(expanded.first).to_be_visible()
            assert "approve" in await expanded.first.inner_text()
            await page.screenshot(path=shots / "4-approve-in-history.png")
        finally:
            await browser.close()

    # 6. The audit: alice approved through a signal that carried no identity.
    records = [r async for r in export(temporal_client, incident=incident)]
    decision = next(r for r in records if r.kind == "decision")
    assert decision.who == "alice@ui" and decision.approve is True
    assert decision.via == "signal"
    assert decision.identity is None
    assert decision.unverified_identity is True
    assert decision.comment == payload["comment"]
    assert records[-1].kind == "outcome" and records[-1].status == "recovered"


def test_missing_chromium_fails_where_the_lab_is_required(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under TRAINMEDIC_REQUIRE_LAB=1 (CI, `make test`) a missing browser is a failure,
    never a quiet skip; elsewhere it is a skip that says how to get one."""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("TRAINMEDIC_REQUIRE_LAB", "1")
    with pytest.raises(pytest.fail.Exception, match="chromium is not installed"):
        chromium()
    monkeypatch.delenv("TRAINMEDIC_REQUIRE_LAB")
    with pytest.raises(pytest.skip.Exception, match=r"install-deps\.sh"):
        chromium()
