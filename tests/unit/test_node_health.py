"""The node health check: each check on scripted GPUs (FakeNvml), a fake `dcgmi` on PATH,
a site script; the signed `GET /health` exchange; the lab's probe over the lab's files."""

from __future__ import annotations

import asyncio
import os
import stat
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from trainmedic import procs
from trainmedic.activities.quarantine import gres_gpus, parse_reason
from trainmedic.adapters.nvml.fake import FakeNvml
from trainmedic.adapters.nvml.protocol import RecoveryAction
from trainmedic.channel.wire import node_key
from trainmedic.domain.health import (
    HealthCheck,
    NodeHealthReport,
    NodeHealthRequest,
    NodeHealthResponse,
)
from trainmedic.health import (
    AgentUnreachable,
    HealthConfig,
    HealthEndpoint,
    HttpNodeHealthProbe,
    HttpReply,
    NodeHealthChecker,
    serve_health,
)
from trainmedic.health.checks import parse_dcgm_diag
from trainmedic.health.wire import WireError, decode_request, encode_request
from trainmedic.lab import faults
from trainmedic.lab.agents import LabNodeHealthProbe

KEY = b"k" * 32  # the site key: the controller's
NODE_KEY = node_key(KEY, "gpu01")  # gpu01's agent holds only its own
NO_DCGMI = HealthConfig(dcgmi=Path("/nonexistent/dcgmi"))


def ask(node: str = "gpu01", **fields: Any) -> NodeHealthRequest:
    return NodeHealthRequest.model_validate(
        {"node": node, "nonce": uuid.uuid4().hex, "at": datetime.now(UTC), **fields}
    )


async def run(
    nvml: FakeNvml | None, config: HealthConfig = NO_DCGMI, **fields: Any
) -> NodeHealthReport:
    return await NodeHealthChecker("gpu01", nvml, config).check(ask(**fields))


def check(report: NodeHealthReport, name: str) -> HealthCheck:
    return next(c for c in report.checks if c.name == name)


# ----------------------------------------------------------------------------- NVML


async def test_healthy_gpus_pass_every_check() -> None:
    report = await run(FakeNvml(gpus=8), expected_gpus=8)
    assert report.healthy, report.detail
    assert [c.name for c in report.checks] == [
        "gpu_count",
        "row_remap",
        "ecc",
        "recovery_action",
        "nvlink",
        "dcgm_diag",
        "site_script",
    ]
    assert check(report, "dcgm_diag").skipped and check(report, "site_script").skipped
    assert check(report, "nvlink").detail == "144 links up"
    assert len(report.ecc_aggregate) == 8
    assert report.driver_version == "570.133.20-fake"


@pytest.mark.parametrize(
    ("damage", "name", "detail"),
    [
        ({"lost": True}, "gpu_count", "gpu 2 lost (fallen off the bus)"),
        ({"remapped_rows_pending": True}, "row_remap", "gpu 2 row remap pending"),
        ({"remapped_rows_failure": True}, "row_remap", "gpu 2 row remapping failed"),
        ({"ecc_uncorrectable_volatile": 3}, "ecc", "gpu 2 3 uncorrectable ECC errors"),
        ({"recovery_action": RecoveryAction.GPU_RESET}, "recovery_action", "asks for GPU_RESET"),
        ({"nvlink_down": [4, 7]}, "nvlink", "gpu 2 NVLink 4, 7 down"),
    ],
)
async def test_each_kind_of_damage_fails_its_check(
    damage: dict[str, object], name: str, detail: str
) -> None:
    nvml = FakeNvml(gpus=8)
    nvml.set(2, **damage)
    report = await run(nvml, expected_gpus=8)
    assert not report.healthy
    failed = report.failed
    assert name in {c.name for c in failed}
    assert detail in check(report, name).detail
    if name != "gpu_count":
        assert [c.name for c in failed] == [name]
        # dcgmi runs only when NVML found nothing wrong.
        assert check(report, "dcgm_diag").detail.startswith("not run")


async def test_an_xid79_gpu_fails_the_count_and_the_recovery_action() -> None:
    nvml = FakeNvml(gpus=8)
    nvml.lose(5)
    report = await run(nvml, expected_gpus=8)
    assert {c.name for c in report.failed} == {"gpu_count", "recovery_action"}
    assert "7 GPUs answer, Slurm's gres says 8" in check(report, "gpu_count").detail
    assert "gpu 5 driver asks for NODE_REBOOT" in check(report, "recovery_action").detail


async def test_fewer_gpus_than_slurm_says() -> None:
    report = await run(FakeNvml(gpus=7), expected_gpus=8)
    assert check(report, "gpu_count").detail == "7 GPUs answer, Slurm's gres says 8"
    assert (await run(FakeNvml(gpus=7))).healthy  # no gres count: nothing to compare


async def test_absent_fields_are_unknown_not_failures() -> None:
    """An old driver (< r570) has no recovery action field; a GPU without NVLink, no
    links; consumer GPUs no ECC or row remapping: recorded as unknown, still healthy."""
    nvml = FakeNvml(gpus=2)
    for i in range(2):
        nvml.set(
            i,
            recovery_action=None,
            nvlink_links=None,
            nvlink_down=None,
            remapped_rows_pending=None,
            remapped_rows_failure=None,
            ecc_uncorrectable_volatile=None,
            ecc_uncorrectable_aggregate=None,
            unsupported={"recovery_action": "Not Supported"},
        )
    report = await run(nvml, expected_gpus=2)
    assert report.healthy, report.detail
    action = check(report, "recovery_action")
    assert action.ok and action.unknown and "Not Supported" in action.detail
    assert check(report, "ecc").unknown and check(report, "row_remap").unknown
    assert check(report, "nvlink").skipped


async def test_ecc_counts_since_the_drain_against_the_baseline() -> None:
    nvml = FakeNvml(gpus=2)
    nvml.set(1, ecc_uncorrectable_aggregate=5)  # old errors, before the drain
    first = await run(nvml)
    assert first.healthy
    baseline = first.ecc_aggregate
    nvml.set(1, ecc_uncorrectable_aggregate=7)
    report = await run(nvml, ecc_baseline=baseline)
    assert check(report, "ecc").detail == "gpu 1 2 new uncorrectable ECC errors since the drain"
    assert (await run(nvml, ecc_baseline=report.ecc_aggregate)).healthy


async def test_nvml_that_cannot_start_fails_and_no_nvml_at_all_fails() -> None:
    report = await run(FakeNvml(fail_init="NVML init failed: driver not loaded"))
    assert [c.name for c in report.failed] == ["nvml"]
    assert "driver not loaded" in report.detail
    assert not (await run(None)).healthy


# ----------------------------------------------------------------------------- dcgmi

DCGM_PASS = """\
Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 3.3.5                                          |
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| NVML Library              | Pass                                           |
| CUDA Main Library         | Pass                                           |
| Permissions and OS Blocks | Pass                                           |
| Persistence Mode          | Warn - GPU: 0 persistence mode is disabled     |
| Environment Variables     | Pass                                           |
| Page Retirement/Row Remap | Pass                                           |
| Graphics Processes        | Skip                                           |
| Inforom                   | Pass                                           |
+---------------------------+------------------------------------------------+
"""
DCGM_FAIL = DCGM_PASS.replace(
    "| Page Retirement/Row Remap | Pass                                           |",
    "| Page Retirement/Row Remap | Fail - GPU: 3 pending row remap                |",
)


def fake_dcgmi(folder: Path, output: str, status: int = 0, sleep: float = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "out.txt").write_text(output)
    script = folder / "dcgmi"
    script.write_text(
        "#!/bin/sh\n"
        f'[ "$*" = "diag -r 1" ] || {{ echo "unexpected args: $*"; exit 64; }}\n'
        f"sleep {sleep}\n"
        f'cat "{folder}/out.txt"\n'
        f"exit {status}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def on_path(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")


def test_the_dcgmi_table_is_read() -> None:
    assert parse_dcgm_diag(DCGM_PASS) == (
        [],
        ["Persistence Mode: Warn - GPU: 0 persistence mode is disabled"],
    )
    failed, _ = parse_dcgm_diag(DCGM_FAIL)
    assert failed == ["Page Retirement/Row Remap: Fail - GPU: 3 pending row remap"]


async def test_dcgmi_on_path_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dcgmi(tmp_path / "bin", DCGM_PASS)
    on_path(monkeypatch, tmp_path / "bin")
    report = await run(FakeNvml(gpus=1), HealthConfig())
    dcgm = check(report, "dcgm_diag")
    assert report.healthy and dcgm.ok and not dcgm.skipped
    assert "passed (warnings: Persistence Mode" in dcgm.detail
    assert dcgm.output and "Denylist" in dcgm.output


async def test_dcgmi_failure_names_the_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_dcgmi(tmp_path / "bin", DCGM_FAIL, status=226)
    on_path(monkeypatch, tmp_path / "bin")
    report = await run(FakeNvml(gpus=1), HealthConfig())
    assert [c.name for c in report.failed] == ["dcgm_diag"]
    assert check(report, "dcgm_diag").detail == (
        "Page Retirement/Row Remap: Fail - GPU: 3 pending row remap"
    )


async def test_dcgmi_exit_status_alone_fails(tmp_path: Path) -> None:
    binary = fake_dcgmi(tmp_path / "bin", "Error: unable to connect to host engine\n", 1)
    report = await run(FakeNvml(gpus=1), HealthConfig(dcgmi=binary))
    assert check(report, "dcgm_diag").detail == "dcgmi exited 1"


async def test_dcgmi_that_hangs_times_out(tmp_path: Path) -> None:
    binary = fake_dcgmi(tmp_path / "bin", DCGM_PASS, sleep=30)
    report = await run(FakeNvml(gpus=1), HealthConfig(dcgmi=binary, dcgm_timeout_s=0.5))
    assert "timed out after" in check(report, "dcgm_diag").detail
    assert not report.healthy


async def test_no_dcgmi_skips_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    report = await run(FakeNvml(gpus=1), HealthConfig())
    assert check(report, "dcgm_diag").skipped and report.healthy
    # Not asked for (the lab): not run, not listed.
    report = await NodeHealthChecker("gpu01", FakeNvml(gpus=1)).check(ask(diag=False))
    assert "dcgm_diag" not in {c.name for c in report.checks}


# ----------------------------------------------------------------------------- site script


def site_script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "site-check"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return script


async def test_site_script_exit_0_is_healthy_and_its_output_kept(tmp_path: Path) -> None:
    script = site_script(tmp_path, 'echo "checking $1"; echo "ib0 up"; exit 0\n')
    config = HealthConfig(dcgmi=NO_DCGMI.dcgmi, site_script=(str(script),))
    report = await run(FakeNvml(gpus=1), config)
    site = check(report, "site_script")
    assert report.healthy and site.ok
    assert site.output == "checking gpu01\nib0 up"


async def test_site_script_failure_fails_the_node(tmp_path: Path) -> None:
    script = site_script(tmp_path, 'echo "ib0 down" >&2; exit 3\n')
    config = HealthConfig(dcgmi=NO_DCGMI.dcgmi, site_script=(str(script),))
    report = await run(FakeNvml(gpus=1), config)
    assert [c.name for c in report.failed] == ["site_script"]
    assert check(report, "site_script").detail.endswith("exited 3: ib0 down")


async def test_site_script_timeout_and_missing_script(tmp_path: Path) -> None:
    script = site_script(tmp_path, "sleep 30\n")
    config = HealthConfig(
        dcgmi=NO_DCGMI.dcgmi, site_script=(str(script),), site_script_timeout_s=0.5
    )
    report = await run(FakeNvml(gpus=1), config)
    assert "timed out after" in check(report, "site_script").detail
    config = HealthConfig(dcgmi=NO_DCGMI.dcgmi, site_script=(str(tmp_path / "nope"),))
    report = await run(FakeNvml(gpus=1), config)
    assert "could not run" in check(report, "site_script").detail


# ----------------------------------------------------------------------------- HTTP


@pytest.fixture
async def agent() -> AsyncIterator[tuple[str, FakeNvml]]:
    """gpu01's agent serving GET /health on a free port; yields its URL template."""
    nvml = FakeNvml(gpus=8)
    endpoint = HealthEndpoint("gpu01", NodeHealthChecker("gpu01", nvml, NO_DCGMI), NODE_KEY)
    port = procs.free_port()
    server = await serve_health(endpoint, "127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}/health?for={{node}}", nvml
    finally:
        server.close()
        await server.wait_closed()


async def test_the_agent_answers_a_signed_request(agent: tuple[str, FakeNvml]) -> None:
    url, nvml = agent
    # {node} names the host in production; here every node's agent is this one.
    probe = HttpNodeHealthProbe(url, KEY, timeout_s=10)
    report = await probe.check(ask(expected_gpus=8))
    assert report.healthy and report.reachable and report.node == "gpu01"
    nvml.lose(3)
    report = await probe.check(ask(expected_gpus=8))
    assert not report.healthy
    assert "gpu 3 lost" in check(report, "gpu_count").detail


async def test_wrong_key_other_node_and_no_key_are_unreachable(
    agent: tuple[str, FakeNvml],
) -> None:
    url = agent[0]
    with pytest.raises(AgentUnreachable, match="answered 401"):
        await HttpNodeHealthProbe(url, b"x" * 32, timeout_s=10).check(ask())
    # A request for gpu02 is signed with gpu02's key: gpu01's agent cannot verify it.
    with pytest.raises(AgentUnreachable, match="answered 401"):
        await HttpNodeHealthProbe(url, KEY, timeout_s=10).check(ask("gpu02"))
    with pytest.raises(AgentUnreachable, match="no site key"):
        await HttpNodeHealthProbe(url, None, timeout_s=10).check(ask())


class Forger(HealthEndpoint):
    """An impostor on the node's port without the site key: it signs with garbage."""

    async def handle(self, method: str, target: str, headers: Mapping[str, str]) -> HttpReply:
        reply = await super().handle(method, target, headers)
        reply.headers["X-Trainmedic-Signature"] = "0" * 64
        return reply


async def test_a_forged_answer_is_not_believed() -> None:
    forger = Forger("gpu01", NodeHealthChecker("gpu01", FakeNvml(gpus=1), NO_DCGMI), NODE_KEY)
    port = procs.free_port()
    server = await serve_health(forger, "127.0.0.1", port)
    try:
        probe = HttpNodeHealthProbe(f"http://127.0.0.1:{port}/health?n={{node}}", KEY)
        with pytest.raises(AgentUnreachable, match="not signed with the site key"):
            await probe.check(ask())
    finally:
        server.close()
        await server.wait_closed()


async def test_an_agent_that_keeps_the_connection_open_is_read_by_length() -> None:
    """The agent's probe listener may keep connections alive: the answer is read by its
    Content-Length, not up to the end of the connection."""
    endpoint = HealthEndpoint("gpu01", NodeHealthChecker("gpu01", FakeNvml(gpus=1)), NODE_KEY)
    held: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        target = head[0].split(" ")[1]
        headers = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
        reply = await endpoint.handle("GET", target, headers)
        extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
        writer.write(
            f"HTTP/1.1 200 OK\r\nContent-Length: {len(reply.body)}\r\n{extra}"
            "Connection: keep-alive\r\n\r\n".encode()
            + reply.body
        )
        await writer.drain()
        held.append(writer)  # never closed while the client reads

    port = procs.free_port()
    server = await asyncio.start_server(serve, "127.0.0.1", port)
    try:
        probe = HttpNodeHealthProbe(f"http://127.0.0.1:{port}/health#{{node}}", KEY, timeout_s=5)
        report = await probe.check(ask(diag=False))
        assert report.healthy
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_nobody_listening_is_unreachable() -> None:
    probe = HttpNodeHealthProbe(f"http://127.0.0.1:{procs.free_port()}/{{node}}", KEY)
    with pytest.raises(AgentUnreachable, match="gpu01's agent"):
        await probe.check(ask())


async def test_a_request_for_another_node_is_refused() -> None:
    """Signed right (by a controller holding gpu02's key) but sent to gpu01's agent."""
    endpoint = HealthEndpoint("gpu01", NodeHealthChecker("gpu01", FakeNvml(gpus=1)), NODE_KEY)
    q, signature = encode_request(ask("gpu02"), NODE_KEY)
    reply = await endpoint.handle("GET", f"/health?q={q}", {"x-trainmedic-signature": signature})
    assert reply.status == 409


def test_requests_are_signed_and_fresh() -> None:
    request = ask()
    q, signature = encode_request(request, KEY)
    assert decode_request(q, signature, KEY) == request
    with pytest.raises(WireError, match="does not match"):
        decode_request(q[:-2] + "AA", signature, KEY)
    with pytest.raises(WireError, match="unsigned"):
        decode_request(q, None, KEY)
    later = datetime.now(UTC) + timedelta(minutes=10)
    with pytest.raises(WireError, match="stale"):
        decode_request(q, signature, KEY, now=later)


async def test_other_paths_and_methods_are_refused() -> None:
    endpoint = HealthEndpoint("gpu01", NodeHealthChecker("gpu01", FakeNvml(gpus=1)), NODE_KEY)
    assert (await endpoint.handle("GET", "/metrics", {})).status == 404
    assert (await endpoint.handle("POST", "/health", {})).status == 405
    assert (await endpoint.handle("GET", "/health?q=abc", {})).status == 401


# ----------------------------------------------------------------------------- the lab


async def test_the_lab_probe_sees_an_injected_xid79_until_it_is_cleared(tmp_path: Path) -> None:
    root = tmp_path / "lab"
    state = faults.node_dir(root, "gpu03") / faults.NVML_STATE
    state.parent.mkdir(parents=True)
    faults.write_json_atomic(state, faults.default_nvml_state("gpu03", 8))
    probe = LabNodeHealthProbe(lambda node: faults.node_dir(root, node) / faults.NVML_STATE)
    assert (await probe.check(ask("gpu03", expected_gpus=8))).healthy
    faults.update_nvml(root, "gpu03", 2, faults.Fault.XID79)
    report = await probe.check(ask("gpu03", expected_gpus=8))
    assert report.source == "lab" and not report.healthy
    assert "gpu 2 lost (fallen off the bus)" in report.detail
    faults.write_json_atomic(state, faults.default_nvml_state("gpu03", 8))
    assert (await probe.check(ask("gpu03", expected_gpus=8))).healthy
    with pytest.raises(AgentUnreachable):
        await probe.check(ask("gpu09"))


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("gres", "count"),
    [
        ("gpu:8", 8),
        ("gpu:h100:8(S:0-1)", 8),
        ("gpu:a100:4,gpu:h100:4", 8),
        ("gpu:h100:8,nic:2", 8),
        ("nic:2", None),
        (None, None),
        ("", None),
    ],
)
def test_gres_gpu_count(gres: str | None, count: int | None) -> None:
    assert gres_gpus(gres) == count


def test_our_drain_reason_names_the_incident_and_category() -> None:
    reason = "trainmedic incident-lab-17-1: gpu_hardware: Xid 79 on gpu02"
    assert parse_reason(reason) == ("incident-lab-17-1", "gpu_hardware")
    assert parse_reason("admin: bad fan") == (None, None)
    assert parse_reason(None) == (None, None)


# ----------------------------------------------------------------------------- settings


async def test_the_agent_endpoint_is_built_from_settings(tmp_path: Path) -> None:
    from trainmedic.config import load_settings
    from trainmedic.errors import ConfigError
    from trainmedic.health import build_health_endpoint

    script = site_script(tmp_path, "exit 0\n")
    settings = load_settings(health_script=script, health_script_timeout="30s")
    with pytest.raises(ConfigError, match="TRAINMEDIC_AGENT_KEY_FILE"):
        build_health_endpoint("gpu01", FakeNvml(gpus=1), settings)
    key_file = tmp_path / "site.key"
    key_file.write_bytes(KEY)
    key_file.chmod(0o600)
    endpoint = build_health_endpoint(
        "gpu01", FakeNvml(gpus=1), load_settings(agent_key_file=key_file, health_script=script)
    )
    assert endpoint.node == "gpu01"
    # Built from the site key file, it answers with gpu01's derived key.
    q, signature = encode_request(ask(), NODE_KEY)
    reply = await endpoint.handle("GET", f"/health?q={q}", {"X-Trainmedic-Signature": signature})
    assert reply.status == 200, reply.body
    site = next(
        c
        for c in NodeHealthResponse.model_validate_json(reply.body).report.checks
        if c.name == "site_script"
    )
    assert site.ok and not site.skipped


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"agent_health_url": "http://gpu01:9470/health"}, "{node}"),
        ({"agent_health_url": "ftp://{node}/health"}, "http(s) URL"),
        ({"agent_health_url": "http://{node}:{port}/health"}, "only {node}"),
        ({"agent_health_timeout": "20m"}, "at most 9m"),
        ({"health_script_timeout": "0s"}, "more than 0s"),
    ],
)
def test_bad_health_settings_are_refused(env: dict[str, str], message: str) -> None:
    from trainmedic.config import load_settings
    from trainmedic.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_settings(**env)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("quarantine: {repeat_offender_incidents: 1}", "use 2 or more, or 0"),
        ("quarantine: {repeat_offender_incidents: -1}", "greater than or equal to 0"),
        ("quarantine: {repeat_offender_window: 0s}", "more than 0s"),
        ("quarantine: {recheck_after: 3h}", "recheck_max_interval (2h) is shorter"),
        ("quarantine: {recheck_limit: x}", "quarantine.recheck_limit"),
        ("quarantine: {repeat_offenders: 3}", "quarantine.repeat_offenders"),
    ],
)
def test_bad_quarantine_policy_keys_are_named(policy: str, message: str) -> None:
    from trainmedic.config import parse_policy
    from trainmedic.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        parse_policy(policy)
    assert message in str(caught.value)


async def test_the_agents_probe_listener_serves_the_health_check() -> None:
    """The node agent mounts the endpoint on its probe listener (one port, one server)."""
    from trainmedic.channel.client import ProbeListener
    from trainmedic.domain.health import HEALTH_PATH

    nvml = FakeNvml(gpus=8)
    listener = ProbeListener("gpu01", "agent-1", "127.0.0.1", 0)
    listener.mount(
        HEALTH_PATH,
        HealthEndpoint("gpu01", NodeHealthChecker("gpu01", nvml, NO_DCGMI), NODE_KEY),
    )
    port = await listener.start()
    try:
        url = f"http://127.0.0.1:{port}/health?for={{node}}"
        probe = HttpNodeHealthProbe(url, KEY, timeout_s=10)
        assert (await probe.check(ask(expected_gpus=8))).healthy
        nvml.lose(0)
        assert not (await probe.check(ask(expected_gpus=8))).healthy
    finally:
        await listener.close()
