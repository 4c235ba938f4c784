"""The Slurm lab against the real daemons: nodes, GPUs, drain + requeue, node death, teardown."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.lab import LAB_GPUS, LAB_NODES, private_root, require_lab
from tests.integration.support import wait_for
from trainmedic import procs
from trainmedic.domain.hostlist import expand
from trainmedic.errors import MissingDependencyError
from trainmedic.lab import Lab, LabError, LabSpec, find_free_port_base
from trainmedic.lab import lab as lab_module
from trainmedic.lab.lab import parse_scontrol_records
from trainmedic.lab.layout import LabLayout, render_gres_conf, render_slurm_conf

pytestmark = pytest.mark.integration


def explain_job(lab: Lab, job: str) -> Callable[[], str]:
    def explain() -> str:
        show = lab.run_client(["scontrol", "-o", "show", "job", job], check=False).stdout
        nodes = lab.run_client(["sinfo", "-N", "-o", "%N %T %E"], check=False).stdout
        return f"{show}\n{nodes}"

    return explain


def job_field(lab: Lab, job: str, key: str) -> str:
    out = lab.run_client(["scontrol", "-o", "show", "job", job]).stdout
    return parse_scontrol_records(out)[0][key]


def running_nodes(lab: Lab, job: str) -> list[str] | None:
    if job_field(lab, job, "JobState") != "RUNNING":
        return None
    return expand(job_field(lab, job, "NodeList"))


def submit(lab: Lab, script: str, *args: str) -> str:
    jobs = lab.layout.jobs
    path = jobs / f"job-{time.monotonic_ns()}.sh"
    path.write_text("#!/bin/bash\n" + script)
    out = lab.run_client(
        ["sbatch", "--parsable", "-D", str(jobs), "-o", f"{jobs}/%j.out", *args, str(path)]
    ).stdout
    return out.strip().split(";")[0]


# ---------------------------------------------------------------- pure parts


def test_config_names_every_node_with_its_own_port_and_gpu_devices(tmp_path: Path) -> None:
    spec = LabSpec(nodes=3, gpus=2, port_base=30000)
    layout = LabLayout(tmp_path)
    conf = render_slurm_conf(spec, layout, "host")
    assert "SlurmctldPort=30000" in conf
    for name, port in (("gpu01", 30002), ("gpu02", 30003), ("gpu03", 30004)):
        assert f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port}" in conf
    assert "PartitionName=gpu Nodes=gpu[01-03] Default=YES" in conf
    assert f"AuthInfo=socket={layout.munge_socket},cred_expire=5" in conf
    gres = render_gres_conf(spec, layout)
    assert f"NodeName=gpu02 Name=gpu File={tmp_path.resolve()}/dev/gpu02/nvidia[0-1]" in gres


def test_scontrol_records_keep_values_with_spaces() -> None:
    line = "NodeName=gpu01 Arch=x86_64 State=DOWN+NOT_RESPONDING Reason=Not responding [root@t]"
    (record,) = parse_scontrol_records(line + "\n\n")
    assert record["NodeName"] == "gpu01"
    assert record["State"] == "DOWN+NOT_RESPONDING"
    assert record["Reason"] == "Not responding [root@t]"


def test_missing_binaries_name_the_packages_and_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(lab_module, "_SEARCH_PATH", str(tmp_path))
    with pytest.raises(MissingDependencyError) as caught:
        Lab(tmp_path / "lab").up()
    message = str(caught.value)
    assert "slurmctld" in message and "munge" in message
    assert "apt-get install -y slurmctld slurmd slurm-client munge" in message
    assert not (tmp_path / "lab").exists()


# ------------------------------------------------------------- the real lab


def test_lab_comes_up_with_every_node_idle_and_eight_gpus(clean_lab: Lab) -> None:
    # Ask Slurm directly rather than through Lab.status, so the parser is not trusted.
    out = clean_lab.run_client(["sinfo", "-h", "-N", "-o", "%N %T %G"]).stdout
    rows = sorted(line.split() for line in out.splitlines())
    assert rows == [[f"gpu{i:02d}", "idle", f"gpu:{LAB_GPUS}"] for i in range(1, LAB_NODES + 1)]
    status = clean_lab.status()
    assert status.running and status.controller_reachable
    assert [n.name for n in status.nodes if n.ready] == [r[0] for r in rows]


def test_two_node_job_runs_on_two_nodes_and_sees_all_their_gpus(clean_lab: Lab) -> None:
    job = submit(
        clean_lab,
        "srun bash -c 'echo \"$SLURMD_NODENAME|$SLURM_JOB_GPUS|$CUDA_VISIBLE_DEVICES\"'\n",
        "-N",
        "2",
        f"--gres=gpu:{LAB_GPUS}",
    )
    wait_for(lambda: job_field(clean_lab, job, "JobState") == "COMPLETED", f"job {job} to complete")
    lines = (clean_lab.layout.jobs / f"{job}.out").read_text().split()
    assert len(lines) == 2
    nodes = set()
    for line in lines:
        node, job_gpus, visible = line.split("|")
        nodes.add(node)
        assert len(job_gpus.split(",")) == LAB_GPUS
        assert len(visible.split(",")) == LAB_GPUS
    assert len(nodes) == 2


def test_requeue_after_drain_moves_the_job_off_the_drained_node(clean_lab: Lab) -> None:
    job = submit(clean_lab, "sleep 600\n", "-N", "2", f"--gres=gpu:{LAB_GPUS}")
    first = wait_for(lambda: running_nodes(clean_lab, job), f"job {job} to run")
    drained = first[0]
    clean_lab.run_client(
        ["scontrol", "update", f"nodename={drained}", "state=drain", "reason=lab-test"]
    )
    clean_lab.run_client(["scontrol", "requeue", job])
    # The requeued job starts by itself once its old credentials expire (the lab's
    # cred_expire is 5 s). StartTime=now would race that: a launch on a node of the
    # previous run then fails with "Job credential revoked".
    second = wait_for(
        lambda: running_nodes(clean_lab, job),
        f"job {job} to run again",
        explain=explain_job(clean_lab, job),
    )
    assert drained not in second
    assert len(second) == 2
    assert clean_lab.status().node(drained).is_drained


def test_kill_node_kills_only_that_nodes_jobs_and_slurm_marks_it_down(clean_lab: Lab) -> None:
    pid_dir = clean_lab.layout.jobs
    victim_node, other_node = "gpu03", "gpu04"
    jobs = {
        node: submit(clean_lab, f"echo $$ > {pid_dir}/{node}.pid\nsleep 600\n", "-w", node)
        for node in (victim_node, other_node)
    }
    for node in (victim_node, other_node):
        wait_for(lambda n=node: (pid_dir / f"{n}.pid").exists(), f"job on {node} to start")
    victim_pid = int((pid_dir / f"{victim_node}.pid").read_text())
    other_pid = int((pid_dir / f"{other_node}.pid").read_text())

    killed = clean_lab.kill_node(victim_node)

    assert victim_pid in killed
    assert not procs.is_alive(victim_pid)
    assert procs.is_alive(other_pid), "a job on another node must survive"
    assert clean_lab.status().node(victim_node).slurmd_pid is None
    # Slurm decides on its own that the node is dead (SlurmdTimeout).
    wait_for(lambda: clean_lab.status().node(victim_node).is_down, f"{victim_node} DOWN")
    assert job_field(clean_lab, jobs[other_node], "JobState") == "RUNNING"

    node = clean_lab.revive_node(victim_node)
    assert node.ready and not node.is_down
    assert node.slurmd_pid is not None


def test_up_again_reuses_the_running_lab_and_refuses_another_shape(slurm_lab: Lab) -> None:
    before = slurm_lab.status()
    again = slurm_lab.up()
    assert again.slurmctld_pid == before.slurmctld_pid
    assert again.munged_pid == before.munged_pid
    assert [n.slurmd_pid for n in again.nodes] == [n.slurmd_pid for n in before.nodes]
    with pytest.raises(LabError, match="already running"):
        slurm_lab.up(nodes=LAB_NODES - 1)


def test_up_restarts_a_missing_daemon(clean_lab: Lab) -> None:
    clean_lab.kill_node("gpu02")
    status = clean_lab.up()
    assert status.node("gpu02").slurmd_pid is not None
    assert status.node("gpu02").ready


def test_kill_node_refuses_names_outside_the_lab(slurm_lab: Lab) -> None:
    with pytest.raises(LabError, match="no node"):
        slurm_lab.kill_node("gpu99")
    with pytest.raises(LabError, match="invalid node name"):
        slurm_lab.kill_node("-gpu01")


def test_down_leaves_no_process_and_a_second_down_is_a_no_op() -> None:
    require_lab()
    with private_root() as root:
        check_down_leaves_nothing(Lab(root, port_base=find_free_port_base(4)))


def check_down_leaves_nothing(lab: Lab) -> None:
    try:
        lab.up(nodes=2, gpus=2)
        job = submit(lab, "sleep 600\n", "-N", "2")
        wait_for(lambda: running_nodes(lab, job), f"job {job} to run")
        assert lab.processes(), "a running lab has processes"
    finally:
        lab.down()
    # Independent of the lab's own bookkeeping: nothing may point into its directory.
    assert procs.processes_under(lab.root) == []
    assert lab.status().stopped
    lab.down()
    assert procs.processes_under(lab.root) == []


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    require_lab()
    import socket

    base = find_free_port_base(4)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", base))
        listener.listen()
        with pytest.raises(LabError, match=f"port {base} is in use"):
            Lab(tmp_path / "lab", port_base=base).up(nodes=2, gpus=1)
    assert procs.processes_under(tmp_path / "lab") == []
