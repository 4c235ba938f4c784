"""Chaos: faults the code was not built around, on the real lab and dev server.

Each scenario runs the controller's real watchers (Slurm poll, log tails, in-process
node agents) against its own cluster name and policy in auto mode, injects a fault the
way a real cluster produces it, and asserts three things: the incidents' outcomes, the
exact Slurm effects (drains and requeues counted in slurmctld's own log, not in our
records), and that no report was lost.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from tests.chaos.support import (
    CORPUS,
    SlurmctldLog,
    control_state,
    controller_for,
    incidents,
    result,
    running,
    wait_incidents,
    xid79_on,
)
from tests.integration.support import async_wait_for, job, node, running_on, submit
from trainmedic.config import Settings
from trainmedic.domain import Outcome
from trainmedic.domain.incident import EffectKind, EffectStatus, IncidentSignal
from trainmedic.lab import Lab
from trainmedic.lab.workload import lab_nodes
from trainmedic.watchers.spoolfile import write_spool_file
from trainmedic.workers.node_agent import SIGNAL_PURPOSE

pytestmark = pytest.mark.integration

# --------------------------------------------------------------------------- scenarios


async def test_the_same_job_failing_three_times(
    lab: Lab, temporal_client: Client, controller: Worker, controller_settings: Settings
) -> None:
    """Each failed run is its own incident; the third with no progress escalates."""
    nccl = (
        "[rank0]: torch.distributed.DistBackendError: NCCL error in: "
        "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, "
        "NCCL version 2.20.5"
    )
    ctld = SlurmctldLog(lab)
    async with controller_for(lab, temporal_client, controller_settings) as detection:
        job_id = submit(lab, 1, body=f"sleep 6\necho '{nccl}'\nexit 1")
        found = await wait_incidents(detection, job_id, 3, timeout=240)
        results = [await result(temporal_client, i) for i in found[:3]]
    assert [i.rsplit("-", 1)[1] for i in found] == ["1", "2", "3"]
    assert [r.outcome for r in results] == [
        Outcome.RECOVERED,
        Outcome.RECOVERED,
        Outcome.ESCALATED,
    ], [r.summary for r in results]
    assert "restart budget spent" in results[2].summary
    assert ctld.requeues(job_id) == 2
    assert detection.router.rejected == []


async def test_three_jobs_on_one_node_that_fails(
    lab: Lab, temporal_client: Client, controller: Worker, controller_settings: Settings
) -> None:
    """One drain, three restarts, and the breaker stays shut (budget: one node)."""
    ctld = SlurmctldLog(lab)
    async with controller_for(lab, temporal_client, controller_settings) as detection:
        # Three jobs land on gpu02 (the other nodes briefly drained by an operator);
        # pinning them with -w would leave them nowhere to go once gpu02 is excluded.
        others = [n for n in lab_nodes(lab) if n != "gpu02"]
        for name in others:
            lab.run_client(
                ["scontrol", "update", f"NodeName={name}", "State=DRAIN", "Reason=ops: hold"]
            )
        jobs = [submit(lab, 1, "-n", "1") for _ in range(3)]
        for job_id in jobs:
            assert await running(lab, job_id, detection) == ["gpu02"]
        for name in others:
            lab.run_client(["scontrol", "update", f"NodeName={name}", "State=RESUME"])
        xid79_on(lab, "gpu02")
        found = [(await wait_incidents(detection, j, 1))[0] for j in jobs]
        results = [await result(temporal_client, i) for i in found]
        state = await control_state(temporal_client, detection)
    assert [r.outcome for r in results] == [Outcome.RECOVERED] * 3, [r.summary for r in results]
    assert ctld.drains("gpu02") == 1
    drains = [e for r in results for e in r.effects if e.kind is EffectKind.DRAIN_NODE]
    # One incident drains; the others find it out (at planning) or reserved (a race).
    assert [e.status for e in drains].count(EffectStatus.APPLIED) == 1, drains
    assert all(
        e.status is EffectStatus.ALREADY_TRUE
        for e in drains
        if e.status is not EffectStatus.APPLIED
    ), drains
    assert sum(ctld.requeues(j) for j in jobs) == 3
    assert [i.node for i in state.isolations] == ["gpu02"]
    assert state.breaker_tripped_at is None, state.breaker_reason
    for job_id in jobs:
        assert "gpu02" not in (running_on(lab, job_id) or ["gpu02"])


async def test_an_admin_sets_a_node_down_under_a_running_job(
    lab: Lab, temporal_client: Client, controller: Worker, controller_settings: Settings
) -> None:
    """Already true: no drain over the admin's DOWN, no budget, the job runs elsewhere."""
    ctld = SlurmctldLog(lab)
    async with controller_for(lab, temporal_client, controller_settings) as detection:
        job_id = submit(lab, 2)
        placed = await running(lab, job_id, detection)
        down = placed[1]
        lab.run_client(
            ["scontrol", "update", f"NodeName={down}", "State=DOWN", "Reason=admin: fan swap"]
        )
        found = await wait_incidents(detection, job_id, 1)
        outcome = await result(temporal_client, found[0])
        state = await control_state(temporal_client, detection)
        now_on = await async_wait_for(
            lambda: running_on(lab, job_id), f"job {job_id} to run again", timeout=90
        )
    assert state.breaker_tripped_at is None, state.breaker_reason
    assert state.isolations == []
    assert ctld.drains(down) == 0
    assert node(lab, down)["Reason"].startswith("admin: fan swap")
    assert down not in now_on
    drains = [e for e in outcome.effects if e.node == down]
    assert all(e.status is EffectStatus.ALREADY_TRUE for e in drains), outcome.effects
    assert outcome.outcome is Outcome.RECOVERED, outcome.summary


async def test_an_operator_resumes_our_node_then_another_fails(
    lab: Lab, temporal_client: Client, controller: Worker, controller_settings: Settings
) -> None:
    """The resume releases the ledger's slot: the second node may be drained."""
    ctld = SlurmctldLog(lab)
    async with controller_for(lab, temporal_client, controller_settings) as detection:
        first = submit(lab, 1)
        [resumed] = await running(lab, first, detection)
        xid79_on(lab, resumed)
        first_result = await result(temporal_client, (await wait_incidents(detection, first, 1))[0])
        assert first_result.outcome is Outcome.RECOVERED, first_result.summary
        lab.run_client(["scontrol", "update", f"NodeName={resumed}", "State=RESUME"])
        # A second job, wherever Slurm puts it (the resumed node included), fails too.
        second = submit(lab, 1)
        [failing] = await running(lab, second, detection)
        xid79_on(lab, failing)
        second_result = await result(
            temporal_client, (await wait_incidents(detection, second, 1))[0]
        )
        state = await control_state(temporal_client, detection)
    assert second_result.outcome is Outcome.RECOVERED, second_result.summary
    assert state.breaker_tripped_at is None, state.breaker_reason
    assert sum(ctld.drains(n) for n in {resumed, failing}) == 2
    assert [i.node for i in state.isolations] == [failing]


async def test_a_user_prints_forged_xid_lines(
    lab: Lab, temporal_client: Client, controller: Worker, controller_settings: Settings
) -> None:
    """While the job runs: a note. When it fails: a restart away from the named node,
    never a drain on the user's word."""
    ctld = SlurmctldLog(lab)
    # The job names the node it runs on, as a real Xid line would.
    forged = (
        "$SLURMD_NODENAME: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
        "GPU has fallen off the bus."
    )
    body = (
        f'echo "{forged}"\n'
        'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then sleep 8; exit 1; fi\n'
        "sleep 600"
    )
    async with controller_for(lab, temporal_client, controller_settings) as detection:
        job_id = submit(lab, 1, body=body)
        named = (await running(lab, job_id, detection))[0]
        await asyncio.sleep(4)
        assert incidents(detection, job_id) == [], "a printed line opened an incident"
        found = await wait_incidents(detection, job_id, 1)
        outcome = await result(temporal_client, found[0])
    assert ctld.drains(named) == 0
    assert "DRAIN" not in node(lab, named)["State"]
    assert [e.kind.value for e in outcome.effects] == ["requeue_excluding"], outcome.effects
    assert "only the job's own output names it" in outcome.effects[0].note
    assert named in job(lab, job_id)["ExcNodeList"]
    assert outcome.outcome is Outcome.RECOVERED, outcome.summary
    assert any(s.kind == "log_match" and s.job_id == job_id for s in detection.router.noted)


async def test_a_healthy_job_printing_real_warnings_is_left_alone(
    lab: Lab, temporal_client: Client, controller: Worker, controller_settings: Settings
) -> None:
    """Real NCCL / PyTorch / framework output of healthy jobs, from the benign corpus,
    printed for 20 s by a job that progresses: no incident, no effect."""
    benign = sorted(CORPUS.glob("*.log"))
    assert len(benign) >= 20, "the benign corpus is missing"
    warnings = lab.layout.jobs / f"benign-{uuid.uuid4().hex[:6]}.txt"
    warnings.parent.mkdir(parents=True, exist_ok=True)
    warnings.write_bytes(b"\n".join(p.read_bytes() for p in benign))
    body = (
        "for i in $(seq 1 40); do\n"
        f"  cat {warnings}\n"
        '  echo "iteration $i/ 1000 | loss 2.31 | step $i"\n'
        "  sleep 0.5\n"
        "done\n"
        "sleep 600"
    )
    ctld = SlurmctldLog(lab)
    async with controller_for(lab, temporal_client, controller_settings) as detection:
        job_id = submit(lab, 1, body=body)
        await running(lab, job_id, detection)
        await asyncio.sleep(25)
        opened = incidents(detection, job_id)
    assert opened == [], opened
    assert job(lab, job_id)["JobState"] == "RUNNING"
    assert job(lab, job_id)["Restarts"] == "0"
    assert ctld.requeues(job_id) == 0


async def test_slurmctld_paused_in_the_middle_of_an_incident(
    lab: Lab, temporal_client: Client, controller: Worker, controller_settings: Settings
) -> None:
    """30 s without a controller: effects wait and retry; each happens exactly once."""
    ctld = SlurmctldLog(lab)
    async with controller_for(lab, temporal_client, controller_settings) as detection:
        job_id = submit(lab, 2)
        placed = await running(lab, job_id, detection)
        culprit = placed[0]
        xid79_on(lab, culprit)
        found = await wait_incidents(detection, job_id, 1)
        pid = lab.status().slurmctld_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(30)
        finally:
            os.kill(pid, signal.SIGCONT)
        outcome = await result(temporal_client, found[0], timeout=240)
    assert outcome.outcome is Outcome.RECOVERED, outcome.summary
    assert ctld.drains(culprit) == 1
    assert ctld.requeues(job_id) == 1
    assert len(incidents(detection, job_id)) == 1


async def test_a_storm_is_one_incident_that_escalates(
    lab: Lab, temporal_client: Client, controller: Worker, controller_settings: Settings
) -> None:
    """More nodes failing in a minute than the threshold: one storm incident reaches
    RecoveryWorkflow, asks a person, and drains nothing."""
    ctld = SlurmctldLog(lab)
    nodes = lab_nodes(lab)
    async with controller_for(lab, temporal_client, controller_settings) as detection:
        for name in nodes:  # what the Slurm watcher would send as 4 of 4 nodes go
            await detection.router.submit(
                IncidentSignal(source="slurm", kind="node_down", nodes=[name], detail="chaos")
            )
        storm = detection.router.storm
        assert storm is not None
        outcome = await result(temporal_client, storm.incident_id)
    assert outcome.outcome is Outcome.ESCALATED, outcome.summary
    assert sum(ctld.drains(n) for n in nodes) == 0


async def test_forged_and_malformed_spool_files_are_set_aside(
    lab: Lab,
    temporal_client: Client,
    controller: Worker,
    controller_settings: Settings,
    tmp_path: Path,
) -> None:
    """With a site key: an unsigned report, a wrongly signed one, garbage, a link to a
    secret and a world-writable file are refused with their reason kept beside them and
    open nothing; a report the node agent signed opens the node's quarantine."""
    key_file = tmp_path / "site.key"
    key_file.write_bytes(os.urandom(32).hex().encode())
    key_file.chmod(0o600)
    key = key_file.read_bytes()
    settings = controller_settings.model_copy(
        update={"spool_key_file": key_file, "state_dir": tmp_path / "state"}
    )
    spool = settings.state_dir / "spool" / "signals"

    def report(node_name: str) -> bytes:
        return (
            IncidentSignal(source="kernel", kind="kernel_xid", nodes=[node_name], detail="Xid 79")
            .model_dump_json()
            .encode()
        )

    ctld = SlurmctldLog(lab)
    async with controller_for(lab, temporal_client, settings) as detection:
        write_spool_file(spool, "a-unsigned.json", report("gpu01"), purpose=SIGNAL_PURPOSE)
        write_spool_file(
            spool, "b-wrong-key.json", report("gpu02"), key=b"x" * 32, purpose=SIGNAL_PURPOSE
        )
        write_spool_file(spool, "c-garbage.json", b"\x00\xff{not json", purpose=SIGNAL_PURPOSE)
        (spool / "d-link.json").symlink_to("/etc/shadow")
        loose = write_spool_file(
            spool, "e-loose.json", report("gpu03"), key=key, purpose=SIGNAL_PURPOSE
        )
        loose.chmod(0o666)
        await async_wait_for(
            lambda: not list(spool.glob("*.json")) or None, "the spool to be read", timeout=30
        )
        assert detection.router.started == []
        write_spool_file(spool, "f-signed.json", report("gpu04"), key=key, purpose=SIGNAL_PURPOSE)
        await async_wait_for(
            lambda: any(i.endswith("-gpu04") for i in detection.router.started) or None,
            "the signed report to open gpu04's quarantine",
            timeout=30,
        )
    aside = sorted(p.name for p in (spool / "bad").iterdir() if not p.name.endswith(".reason"))
    assert aside == [
        "a-unsigned.json",
        "b-wrong-key.json",
        "c-garbage.json",
        "d-link.json",
        "e-loose.json",
    ]
    reasons = {p.name: p.read_text() for p in (spool / "bad").glob("*.reason")}
    assert len(reasons) == 5 and all(reasons.values())
    assert [i for i in detection.router.started if not i.endswith("-gpu04")] == []
    assert sum(ctld.drains(n) for n in lab_nodes(lab)) == 0


async def test_a_fifo_and_dev_zero_as_job_output_do_not_stop_the_controller(
    lab: Lab, temporal_client: Client, controller: Worker, controller_settings: Settings
) -> None:
    """A job owner swaps a FIFO in as the output file, another writes to /dev/zero:
    the tails and the attribution scan refuse them, and the controller still notices
    and diagnoses a third job's failure in time."""
    jobs_dir = lab.layout.jobs
    async with controller_for(lab, temporal_client, controller_settings) as detection:
        swapped = submit(lab, 1)
        await running(lab, swapped, detection)
        output = jobs_dir / f"{swapped}.out"
        output.unlink(missing_ok=True)
        os.mkfifo(output)
        zero = lab.run_client(
            [
                "sbatch",
                "--parsable",
                "-N",
                "1",
                "-o",
                "/dev/zero",
                "--wrap",
                "sleep 3; exit 2",
            ]
        ).stdout.strip()
        failing = submit(lab, 1, body="sleep 3\necho 'ValueError: bad config' >&2\nexit 1")
        [zero_incident] = await wait_incidents(detection, zero, 1, timeout=90)
        [incident] = await wait_incidents(detection, failing, 1, timeout=90)
        zero_result = await result(temporal_client, zero_incident, timeout=240)
        failing_result = await result(temporal_client, incident, timeout=240)
    assert failing_result.diagnosis is not None
    assert failing_result.outcome in {Outcome.STOPPED, Outcome.ESCALATED}, failing_result.summary
    assert zero_result.diagnosis is not None
    assert "not a regular file" in zero_result.diagnosis.summary, zero_result.diagnosis.summary


async def test_a_job_pinned_to_the_failing_node_is_left_for_a_person(
    lab: Lab, temporal_client: Client, controller: Worker, controller_settings: Settings
) -> None:
    """`sbatch -w gpu02` and gpu02's GPU falls off the bus: the node is drained, but a
    restart excluding it could never start, so the job is not requeued to pend for ever."""
    ctld = SlurmctldLog(lab)
    async with controller_for(lab, temporal_client, controller_settings) as detection:
        job_id = submit(lab, 1, "-w", "gpu02")
        await running(lab, job_id, detection)
        xid79_on(lab, "gpu02")
        [incident] = await wait_incidents(detection, job_id, 1)
        outcome = await result(temporal_client, incident)
    assert outcome.outcome is Outcome.ESCALATED, outcome.summary
    assert "must run on gpu02 (--nodelist)" in outcome.summary
    assert ctld.drains("gpu02") == 1
    assert ctld.requeues(job_id) == 0
