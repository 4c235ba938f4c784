"""Tuning rounds 7 to 10 on tests/corpus/real/tune: where in a traceback an error was
raised (a checkpoint loader or saver), the header naming whose traceback it is, three
shapes of a collective timeout that a restart meets again (at start-up, with the job's own
short timeout, ranks out of step), and the words of the fabric stack (AWS OFI, libfabric's
ENOMEM, the GPU's firmware, NVLink peer access, /dev/shm files) and of dying processes.

Each line is published text from the tune case named beside it.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.attribution_support import ENGINE
from tests.unit.attribution_support import diagnose as _diagnose
from trainmedic.domain import Action, AttributionRequest, Category

# tune/g-014.log: torch's distributed checkpoint fails to load a key on rank 3.
DCP_LOAD = [
    "Traceback (most recent call last): (RANK 3)",
    '  File "/opt/conda/envs/pytorch/lib/python3.9/site-packages/torch/distributed/_shard/'
    'checkpoint/utils.py", line 140, in reduce_scatter',
    "    local_data = map_fun()",
    '  File "/opt/conda/envs/pytorch/lib/python3.9/site-packages/torch/distributed/_shard/'
    'checkpoint/state_dict_loader.py", line 89, in local_step',
    "    local_plan = planner.create_local_plan()",
    "    md = metadata.state_dict_metadata[fqn]",
    "KeyError: 'pos_embedding'",
]
# tune/g-016.log: torch.multiprocessing.spawn's header above process 1's traceback.
SPAWN_NAN = [
    "-- Process 1 terminated with the following error:",
    "Traceback (most recent call last):",
    '  File "/home/alfrid/.virtualenvs/jupyter/lib/python3.6/site-packages/detectron2/engine/'
    'train_loop.py", line 239, in _detect_anomaly',
    "    self.iter, loss_dict",
    "FloatingPointError: Loss became infinite or NaN at iteration=137!",
]
# tune/g-033.log: the very first broadcast times out while another rank is still starting.
FIRST_BROADCAST = (
    "[rank3]:[E1119 13:21:12.512781555 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=1800000) ran for 1800000 milliseconds before timing out."
)
# tune/g-021.log (aws-ofi-nccl on a p4d).
EFA_ENOMEM = (
    "libfabric:17778:1732779731::efa:cq:efa_cq_ibv_cq_ex_open_with_ibv_create_cq_ex():92<warn> "
    "Unable to create extended CQ: Cannot allocate memory"
)
OFI_CQ_FAILED = (
    "algo-1:17778:17848 [5] nccl_ofi_ofiutils_init_connection:274 NCCL WARN NET/OFI Couldn't "
    "open CQ. RC: -22, ERROR: Invalid argument"
)
OFI_INIT_FAILED = (
    "algo-1:17778:17848 [5] nccl_net_ofi_create_plugin:259 NCCL WARN NET/OFI aws-ofi-nccl "
    "initialization failed"
)
# tune/g-040.log (dmesg of a GPU whose firmware stopped answering).
GSP_TIMEOUT = [
    "[   84.300488] NVRM: GPU6 _kgspLogRpcTimeout: ********************************* GSP "
    "Timeout **********************************",
    "[  101.209077] NVRM: GPU 0000:a1:00.0: RmInitAdapter failed! (0x62:0x40:2168)",
]
# tune/g-052.log: DataLoader workers share tensors through /dev/shm.
SHM_FULL = (
    "RuntimeError: unable to write to file </torch_8289_606636967_0>: No space left on device (28)"
)


def test_an_error_raised_inside_a_checkpoint_loader_is_a_resume_mismatch(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, DCP_LOAD)
    assert (diagnosis.category, diagnosis.action) == (Category.CHECKPOINT, Action.STOP)
    assert diagnosis.transient is False
    assert "while loading a checkpoint" in diagnosis.summary
    assert "checkpoint.resume_frame" in diagnosis.rule_ids
    assert diagnosis.culprit_ranks == [3]  # from the traceback's "(RANK 3)" header


def test_the_same_error_outside_a_loader_stays_the_programs(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, ["Traceback (most recent call last):", DCP_LOAD[-1]])
    assert diagnosis.category is Category.USER_CODE
    assert "checkpoint.resume_frame" not in diagnosis.rule_ids


def test_a_loader_frame_far_above_the_error_is_another_traceback(tmp_path: Path) -> None:
    lines = [*DCP_LOAD[:5], *(["step 10 loss 2.1"] * 100), DCP_LOAD[-1]]
    assert _diagnose(tmp_path, lines).category is Category.USER_CODE


def test_a_hardware_error_inside_a_loader_is_still_hardware(tmp_path: Path) -> None:
    lines = [*DCP_LOAD[:5], "RuntimeError: CUDA error: uncorrectable ECC error encountered"]
    assert _diagnose(tmp_path, lines).category is Category.GPU_MEMORY_ECC


def test_spawn_header_names_the_process_of_the_traceback(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, SPAWN_NAN)
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)
    assert diagnosis.rule_ids[0] == "python.nan_loss"
    assert diagnosis.culprit_ranks == [1]


def test_a_timeout_in_the_first_collectives_asks_a_person(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, [FIRST_BROADCAST])
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.ESCALATE)
    assert "start-up" in diagnosis.summary


def test_a_timeout_after_training_ran_is_still_restarted(tmp_path: Path) -> None:
    later = FIRST_BROADCAST.replace("SeqNum=1,", "SeqNum=4,")
    diagnosis = _diagnose(tmp_path, [later])
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.RESTART)


def test_libfabric_enomem_is_not_host_oom(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, [EFA_ENOMEM, OFI_CQ_FAILED, OFI_INIT_FAILED])
    assert diagnosis.category is Category.NETWORK_NCCL
    assert diagnosis.rule_ids[0] == "nccl.ofi_setup_failure"
    assert diagnosis.action is Action.ESCALATE
    assert diagnosis.culprit_nodes == ["algo-1"]  # where to look; nothing is drained


def test_gsp_timeout_drains_the_node(tmp_path: Path) -> None:
    lines = [f"Mar  3 10:01:02 gpu07 kernel: {line.split('] ', 1)[1]}" for line in GSP_TIMEOUT]
    diagnosis = _diagnose(tmp_path, lines)  # the syslog prefix is the test's, for the node
    assert (diagnosis.category, diagnosis.action) == (
        Category.GPU_HARDWARE,
        Action.DRAIN_AND_RESTART,
    )
    assert diagnosis.culprit_nodes == ["gpu07"]


def test_a_full_dev_shm_is_the_dataloaders_not_the_disks(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, [SHM_FULL])
    assert (diagnosis.category, diagnosis.action) == (Category.DATA_LOADER, Action.STOP)


# tune/g-085.log: the job set a 60 s timeout while rank 0 scans its labels.
SHORT_TIMEOUT = (
    "[E ProcessGroupNCCL.cpp:567] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=60000) ran for 67434 milliseconds before timing out."
)
# tune/g-090.log: two ranks timed out in different collectives of one group.
OUT_OF_STEP = [
    "[E ProcessGroupNCCL.cpp:719] [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=7559, OpType=_ALLGATHER_BASE, Timeout(ms)=1800000) ran for 1806456 "
    "milliseconds before timing out.",
    "[E ProcessGroupNCCL.cpp:719] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=7561, OpType=_ALLGATHER_BASE, Timeout(ms)=1800000) ran for 1806450 "
    "milliseconds before timing out.",
]
# tune/g-066.log: Trainer renames its staging directory, racing another node.
SAVE_RENAME = [
    '  File "/home/pai/envs/llama_etuning/lib/python3.9/site-packages/transformers/trainer.py",'
    " line 2388, in _save_checkpoint",
    "    os.rename(staging_output_dir, output_dir)",
    "FileNotFoundError: [Errno 2] No such file or directory: '/mnt/nas/abc/saved_model/"
    "tmp-checkpoint-81' -> '/mnt/nas/abc/saved_model/checkpoint-81'",
]
# tune/g-074.log and g-096.log: how torchrun and torch.multiprocessing.spawn report a death.
ELASTIC_SIGBUS = (
    "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -7) local_rank: 2 "
    "(pid: 3767) of binary: /usr/bin/python3"
)
SPAWN_SIGFPE = "Exception: process 2 terminated with signal SIGFPE"
# tune/g-094.log, g-098.log, g-110.log.
NVLINK_PEER = (
    "[rank1]: RuntimeError: CUDA error: Invalid access of peer GPU memory over nvlink or a "
    "hardware error"
)
NCCL_CONNECT = (
    "tj1-asr-train-v100-13:941227:943077 [0] include/socket.h:390 NCCL WARN Connect to "
    "10.38.10.112<21724> failed : Connection refused"
)
RAY_ACTOR_DIED = [
    "[2025-05-10 00:18:27] ray.exceptions.ActorDiedError: The actor died unexpectedly before "
    "finishing this task.",
    "[2025-05-10 00:18:27] \tip: train-1316148307689748608-9zzm714v3bpc-worker-0",
]


def test_a_short_timeout_of_the_jobs_own_asks_a_person(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, [SHORT_TIMEOUT])
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.ESCALATE)
    assert "after only 60 s" in diagnosis.summary
    default = SHORT_TIMEOUT.replace("Timeout(ms)=60000", "Timeout(ms)=600000")
    assert _diagnose(tmp_path, [default]).action is Action.RESTART


def test_ranks_out_of_step_ask_a_person(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, OUT_OF_STEP)
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.ESCALATE)
    assert "out of step" in diagnosis.summary


def test_a_few_ranks_behind_the_rest_are_a_straggler_not_out_of_step(tmp_path: Path) -> None:
    # Three ranks wait in #7561 for the one still at #7559: it is named and restarted.
    lines = [OUT_OF_STEP[0]] + [
        OUT_OF_STEP[1].replace("[Rank 1]", f"[Rank {r}]") for r in (1, 2, 3)
    ]
    diagnosis = _diagnose(tmp_path, lines)
    assert diagnosis.action is Action.RESTART and diagnosis.culprit_ranks == [0]


def test_a_program_error_under_a_checkpoint_saver_fails_every_save(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, SAVE_RENAME)
    assert (diagnosis.category, diagnosis.action) == (Category.CHECKPOINT, Action.STOP)
    assert "while saving a checkpoint" in diagnosis.summary


def test_a_full_disk_under_a_checkpoint_saver_stays_the_storages(tmp_path: Path) -> None:
    full = [*SAVE_RENAME[:2], "OSError: [Errno 28] No space left on device"]
    assert _diagnose(tmp_path, full).category is Category.STORAGE_IO


def test_the_first_failed_local_rank_is_named_without_a_root_cause(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, [ELASTIC_SIGBUS])
    assert diagnosis.action is Action.ESCALATE and diagnosis.culprit_ranks == [2]


def test_spawned_process_signals(tmp_path: Path) -> None:
    fpe = _diagnose(tmp_path, [SPAWN_SIGFPE])
    assert (fpe.category, fpe.action, fpe.culprit_ranks) == (
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
        [2],
    )
    assert fpe.rule_ids[0] == "proc.native_crash"
    killed = _diagnose(tmp_path, [SPAWN_SIGFPE.replace("SIGFPE", "SIGKILL")])
    assert killed.rule_ids[0] == "proc.sigkill" and killed.culprit_ranks == [2]
    for signal, rule_id in (("SIGSEGV", "proc.segfault"), ("SIGBUS", "proc.bus_error")):
        died = _diagnose(tmp_path, [SPAWN_SIGFPE.replace("SIGFPE", signal)])
        assert died.rule_ids[0] == rule_id and died.culprit_ranks == [2]


def test_nvlink_peer_access_asks_a_person_before_draining(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, [NVLINK_PEER])
    assert (diagnosis.category, diagnosis.action) == (Category.NVLINK_FABRIC, Action.ESCALATE)
    assert diagnosis.culprit_ranks == [1]


def test_nccl_connect_refused_at_set_up_names_where(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, [NCCL_CONNECT])
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.ESCALATE)
    assert diagnosis.culprit_nodes == ["tj1-asr-train-v100-13"]


def test_ray_actor_ip_field_may_be_a_pod_name(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, RAY_ACTOR_DIED)
    assert diagnosis.culprit_nodes == ["train-1316148307689748608-9zzm714v3bpc-worker-0"]


# tune/g-127.log, g-142.log, g-131.log.
PROLOG_FAILURE = [
    "salloc: Prolog failure on node k003-006",
    "salloc: Job allocation 235454 has been revoked.",
]
OUT_OF_STEP_MIXED = [
    "[rank0]:[E1122 06:40:00.504052851 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=122, OpType=_REDUCE_SCATTER_BASE, "
    "NumelIn=106343680, NumelOut=53171840, Timeout(ms)=600000) ran for 600080 milliseconds "
    "before timing out.",
    "[rank1]:[E1122 06:40:02.586033171 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID "
    "0(default_pg) Rank 1] Timeout at NCCL work: 126, last enqueued NCCL work: 128, last "
    "completed NCCL work: 125.",
]
NCCL_CUDA_INVALID = [
    "[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/"
    "distributed/c10d/NCCLUtils.hpp:268, unhandled cuda error (run with NCCL_DEBUG=INFO for "
    "details), NCCL version 2.21.5",
    "[rank0]: ncclUnhandledCudaError: Call to CUDA function failed.",
    "[rank0]: Cuda failure 1 'invalid argument'",
]


def test_a_failed_prolog_restarts_without_its_node(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, PROLOG_FAILURE)
    assert (diagnosis.category, diagnosis.action) == (
        Category.NODE_DOWN,
        Action.RESTART_EXCLUDING,
    )
    assert diagnosis.culprit_nodes == ["k003-006"]


def test_lines_without_a_group_belong_to_the_one_named_group(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, OUT_OF_STEP_MIXED)
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.ESCALATE)


def test_a_cuda_call_failing_inside_nccl_asks_a_person(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, NCCL_CUDA_INVALID)
    assert (diagnosis.category, diagnosis.action) == (Category.CUDA_SOFTWARE, Action.ESCALATE)
    assert diagnosis.culprit_ranks == [0]


def test_ray_oom_names_the_node_from_the_errors_own_memory_line(tmp_path: Path) -> None:
    # tune/g-105.log: the OutOfMemoryError's own line gives the node's address.
    lines = [
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        "Memory on the node (IP: 10.20.49.141, ID: 4748aa6d1bc114b8bf58822d0b162796a1d36a79dee5"
        "c167c9bf91f5) where the task (actor ID: 9e43ace6a1234e13df7b456b01000000, pid=4100606, "
        "memory used=56.57GB) was running was 246.41GB / 251.54GB (0.979583)",
    ]
    diagnosis = _diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_HOST, Action.STOP)
    assert diagnosis.culprit_nodes == ["10.20.49.141"]


# tune/g-173.log (pyxis on a node whose user-namespace limit is exhausted) and g-205.log.
PYXIS_NAMESPACE = [
    "slurmstepd: error: pyxis: container start failed with error code: 1",
    "slurmstepd: error: pyxis:     enroot-nsenter: failed to create user namespace: No space "
    "left on device",
    "slurmstepd: error: pyxis: couldn't start container",
    "srun: error: node001: task 0: Exited with exit code 1",
]
PADDLE_OOM = (
    "Out of memory error on GPU 0. Cannot allocate 172.000000MB memory on GPU 0, 23.486572GB "
    "memory has been allocated and available memory is only 167.062500MB."
)


def test_a_container_that_cannot_start_on_the_node_asks_a_person(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, PYXIS_NAMESPACE)
    assert diagnosis.rule_ids[0] == "slurm.container_setup_failed"
    assert diagnosis.action is Action.ESCALATE  # not a stop for a full disk


def test_paddle_gpu_oom_stops(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, [PADDLE_OOM])
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_GPU, Action.STOP)


def test_an_nccl_system_error_alone_asks_a_person(tmp_path: Path) -> None:
    # tune/g-206 and the like: set-up or configuration, not a blip to restart through.
    line = (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for "
        "details), NCCL version 2.19.3"
    )
    diagnosis = _diagnose(tmp_path, [line])
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.ESCALATE)


def test_the_ofi_plugin_falling_back_hides_no_real_cause(tmp_path: Path) -> None:
    # Printed on machines without EFA, after which NCCL goes on over sockets (review 11).
    later = "RuntimeError: CUDA error: an illegal memory access was encountered"
    diagnosis = _diagnose(tmp_path, [OFI_INIT_FAILED, later])
    assert diagnosis.rule_ids[0] == "cuda.illegal_address"
    alone = _diagnose(tmp_path, [OFI_INIT_FAILED])
    assert (alone.category, alone.action) == (Category.UNKNOWN, Action.ESCALATE)


def test_a_skipped_nan_step_does_not_stop_the_job(tmp_path: Path) -> None:
    # A trainer that skips a NaN step and later dies of a plain timeout: restarted.
    lines = [
        "[rank0]: loss is nan, skipping batch",
        FIRST_BROADCAST.replace("SeqNum=1,", "SeqNum=900,"),
    ]
    diagnosis = _diagnose(tmp_path, lines)
    assert diagnosis.action is Action.RESTART


def test_a_generic_error_under_a_loader_frame_asks_a_person(tmp_path: Path) -> None:
    # A timeout raised inside the loader may pass on retry (review 11).
    lines = [*DCP_LOAD[:5], "OSError: [Errno 110] Connection timed out"]
    diagnosis = _diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.CHECKPOINT, Action.ESCALATE)


def test_an_object_store_timeout_under_a_loader_frame_restarts(tmp_path: Path) -> None:
    # The store's own words say the read may pass on a later try.
    lines = [*DCP_LOAD[:5], "botocore.exceptions.ReadTimeoutError: Read timeout on endpoint URL"]
    diagnosis = _diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (Category.STORAGE_IO, Action.RESTART)


def test_a_handled_load_failure_does_not_frame_a_later_error(tmp_path: Path) -> None:
    lines = [
        *DCP_LOAD[1:5],
        "FileNotFoundError: [Errno 2] No such file or directory: 'ckpt/latest'",
        "no checkpoint found, starting from scratch",
        "step 10 loss 2.3",
        "RuntimeError: Expected all tensors to be on the same device, but found at least two "
        "devices, cuda:0 and cpu!",
    ]
    assert _diagnose(tmp_path, lines).category is Category.USER_CODE


def test_a_local_rank_is_not_named_as_the_jobs_rank_on_several_nodes(tmp_path: Path) -> None:
    # local_rank 2 on the second of two nodes is rank 10, not rank 2 (review 11).
    log = tmp_path / "job.log"
    log.write_text(f"gpu02: {ELASTIC_SIGBUS}\n")
    request = AttributionRequest(log_paths=[str(log)], nodelist=["gpu01", "gpu02"])
    assert ENGINE.attribute(request).culprit_ranks == []
