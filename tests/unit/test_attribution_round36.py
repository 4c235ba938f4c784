"""Rounds 36 and 37 (second session of 2026-12-03): decisions that the tune split's new
misses asked for.

Lines quoted from a tune case name it; the others follow the tools' own formats.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.attribution_support import ENGINE, diagnose
from trainmedic.domain import Action, Category

DEEPSPEED_KILLS = (
    "[2023-04-16 21:54:13,235] [INFO] [launch.py:428:sigkill_handler] Killing subprocess 62215"
)


@pytest.mark.parametrize(
    "lines",
    [
        # tune g-1065: two ranks' messages interleaved on one line, then a clean one.
        [
            "memory allocation of memory allocation of 20971522097152 bytes failed",
            " bytes failed",
            "memory allocation of 2097152 bytes failed",
            DEEPSPEED_KILLS,
        ],
        ["memory allocation of 2097152 bytes failed"],
    ],
)
def test_rusts_allocation_failure_is_the_host_out_of_memory(
    tmp_path: Path, lines: list[str]
) -> None:
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.rule_ids[0] == "oom.host_python"
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_HOST, Action.STOP)


def test_rays_out_of_memory_advice_is_its_memory_monitors_kill(tmp_path: Path) -> None:
    # tune g-1086: a truncated job log kept the table of the biggest workers and the advice.
    diagnosis = diagnose(
        tmp_path,
        [
            "(ActorModelRayActor pid=8249) 8800\t1.18\tray::ReferenceModelRayActor",
            "(ActorModelRayActor pid=8249) Refer to the documentation on how to address the out "
            "of memory issue: https://docs.ray.io/en/latest/ray-core/scheduling/"
            "ray-oom-prevention.html. Consider provisioning more memory on this node or reducing "
            "task parallelism by requesting more CPUs per task.",
        ],
    )
    assert diagnosis.rule_ids == ["ray.oom_killed"]
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_HOST, Action.STOP)


TF_UNAVAILABLE = (
    "I  worker-replica-1 Error reported to Coordinator: <class 'tensorflow.python.framework."
    "errors_impl.UnavailableError'>, Stream removed  worker-replica-1"
)


def test_tensorflow_losing_a_peer_alone_restarts_once(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, [TF_UNAVAILABLE])  # tune g-1085
    assert diagnosis.rule_ids == ["tf.peer_unavailable"]
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.RESTART)


def test_the_peers_own_error_decides_over_tensorflows_lost_connection(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when "
            "allocating tensor with shape[64,1024,1024] on "
            "/job:worker/replica:0/task:0/device:GPU:0",
            TF_UNAVAILABLE,
        ],
    )
    assert diagnosis.category is Category.OOM_GPU


def test_ray_saying_an_actor_is_unavailable_is_not_tensorflows_peer(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        ["ray.exceptions.ActorUnavailableError: The actor d5a1 is unavailable: RpcError"],
    )
    assert "tf.peer_unavailable" not in diagnosis.rule_ids


@pytest.mark.parametrize(
    "frame",
    [
        "    synchronize (torch/cuda/__init__.py:792)",  # py-spy, tune g-1116
        '  File "/usr/lib/python3/dist-packages/torch/cuda/__init__.py", line 792 in synchronize',
    ],
)
def test_a_stack_dump_waiting_for_the_gpu_is_a_hang_for_a_person(
    tmp_path: Path, frame: str
) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            'Thread 175053 (active): "MainThread"',
            frame,
            "    independent_gradient_partition_epilogue "
            "(deepspeed/runtime/zero/stage_1_and_2.py:764)",
        ],
    )
    assert diagnosis.rule_ids == ["hang.stack_dump_in_collective"]
    assert (diagnosis.category, diagnosis.action) == (Category.HANG, Action.ESCALATE)


def _rules_matching(line: str) -> set[str]:
    return {m.rule.id for m in ENGINE.matcher.match(line)}


def test_a_traceback_through_synchronize_is_not_a_dump() -> None:
    # A Python traceback says ", line 792, in synchronize": the error under it decides.
    frame = '  File "/opt/torch/cuda/__init__.py", line 792, in synchronize'
    assert "hang.stack_dump_in_collective" not in _rules_matching(frame)
    assert "hang.stack_dump_in_collective" in _rules_matching(frame.replace(", in", " in"))


@pytest.mark.parametrize(
    "line",
    [
        # tune g-1102, at a periodic save.
        "RuntimeError: [enforce fail at inline_container.cc:274] . unexpected pos 203894208 vs "
        "203894096",
        "  what():  [enforce fail at inline_container.cc:659] .unexpected pos 64 vs 0",
        "RuntimeError: [enforce fail at inline_container.cc:445] . PytorchStreamWriter failed "
        "writing file data/176: file write failed",
    ],
)
def test_a_short_checkpoint_write_is_for_a_person_to_check_the_storage(
    tmp_path: Path, line: str
) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["storage.checkpoint_write_failed"]
    assert (diagnosis.category, diagnosis.action) == (Category.STORAGE_IO, Action.ESCALATE)
    assert "checkpoint.save_failed" not in _rules_matching(line)


def test_sruns_segfaulted_task_names_its_rank(tmp_path: Path) -> None:
    # tune g-501: srun says "Segmentation fault" only of the task's own process.
    diagnosis = diagnose(tmp_path, ["srun: error: ip-26-0-141-217: task 16: Segmentation fault"])
    assert diagnosis.rule_ids == ["proc.segfault"]
    assert diagnosis.culprit_ranks == [16]


def test_sruns_task_out_of_memory_names_the_node_not_a_rank(tmp_path: Path) -> None:
    # The cgroup counts the whole task: where torchrun starts the ranks, task 2 is the
    # third node's launcher with all its ranks (review 26).
    diagnosis = diagnose(tmp_path, ["srun: error: node107: task 2: Out Of Memory"])
    assert diagnosis.rule_ids == ["oom.host_slurm"]
    assert (diagnosis.culprit_nodes, diagnosis.culprit_ranks) == (["node107"], [])


def test_sruns_range_of_tasks_names_no_rank(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, ["srun: error: gpu02: tasks 8-15: Out Of Memory"])
    assert diagnosis.rule_ids == ["oom.host_slurm"]
    assert diagnosis.culprit_ranks == []


@pytest.mark.parametrize(
    "line",
    [
        # tune g-1166: Megatron's index mappings, built by rank 0, not yet there on a node.
        "c000001: FileNotFoundError: [Errno 2] No such file or directory: "
        "'/work/guanhua/dataset/index-cache/43d5bc1477867ae12d66da383c2b664b_doc_idx.npy'",
        # tune g-1165: datasets' map cache, written under the main node's own ~/.cache.
        "FileNotFoundError: [Errno 2] Failed to open local file '/home/sysadm/.cache/"
        "huggingface/datasets/json/finetune-3d2c7fccd95317e1/0.0.0/e347ab1c/"
        "cache-66a5cd42fef01eaa_00000_of_00032.arrow'. Detail: [errno 2] No such file",
    ],
)
def test_a_missing_cache_the_job_builds_itself_is_for_a_person(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["dataloader.derived_cache_missing"]
    assert (diagnosis.category, diagnosis.action) == (Category.DATA_LOADER, Action.ESCALATE)


def test_a_missing_input_file_still_stops(tmp_path: Path) -> None:
    line = "FileNotFoundError: [Errno 2] No such file or directory: '/data/train_text_document.idx'"
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["storage.file_not_found"]
    assert diagnosis.action is Action.STOP


@pytest.mark.parametrize(
    "line",
    [
        "[rank0]: pyarrow.lib.ArrowInvalid: offset overflow while concatenating arrays",  # g-1148
        "pyarrow.lib.ArrowInvalid: JSON parse error: Column() changed from object to array in "
        "row 0",
        "datasets.exceptions.DatasetGenerationCastError: An error occurred while generating "
        "the dataset",
    ],
)
def test_arrow_refusing_the_datasets_files_stops(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids == ["dataloader.dataset_format_error"]
    assert (diagnosis.category, diagnosis.action) == (Category.DATA_LOADER, Action.STOP)
    assert diagnosis.transient is False


def test_arrows_io_error_is_not_the_datas_format(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path, ["pyarrow.lib.ArrowIOError: Failed to open local file '/data/train.arrow'"]
    )
    assert "dataloader.dataset_format_error" not in diagnosis.rule_ids


def test_datasets_wrapping_a_read_timeout_does_not_stop(tmp_path: Path) -> None:
    # Its DatasetGenerationError wraps whatever failed while generating (review 26).
    diagnosis = diagnose(
        tmp_path,
        [
            "requests.exceptions.ReadTimeout: HTTPSConnectionPool(host='huggingface.co', "
            "port=443): Read timed out. (read timeout=10)",
            "The above exception was the direct cause of the following exception:",
            "datasets.exceptions.DatasetGenerationError: An error occurred while generating the "
            "dataset",
        ],
    )
    assert "dataloader.dataset_format_error" not in diagnosis.rule_ids
    assert diagnosis.action is not Action.STOP


def test_a_corrupt_allocation_size_is_not_the_host_out_of_memory() -> None:
    assert "oom.host_python" not in _rules_matching(
        "memory allocation of 18446744073709551615 bytes failed"
    )


@pytest.mark.parametrize(
    ("lines", "rule", "category"),
    [
        # tune g-1177 (NCCL 2.26's NIC fusion, NVIDIA/nccl#1748).
        (
            ["graph/topo.h:230 NCCL WARN Could not find NET with id 0"],
            "nccl.topology_no_net",
            Category.NETWORK_NCCL,
        ),
        # tune g-268: a GPU's PCI path NCCL cannot resolve, its error climbing the stack.
        (
            [
                "SHJS-PF4ZKYLL:92777:92889 [0] graph/xml.cc:332 NCCL WARN Could not find real "
                "path of /sys/class/pci_bus/0000:01/../../0000:01:00.0",
                "SHJS-PF4ZKYLL:92777:92889 [0] NCCL INFO graph/xml.cc:469 -> 2",
                "SHJS-PF4ZKYLL:92777:92889 [0] NCCL INFO graph/topo.cc:523 -> 2",
                "SHJS-PF4ZKYLL:92777:92889 [0] NCCL INFO init.cc:581 -> 2",
            ],
            "nccl.topology_detection_failed",
            Category.CUDA_SOFTWARE,
        ),
        # tune g-982: a topology file without the CPU's attributes.
        (
            [
                "ncclInternalError: Internal check failed.",
                "Last error:",
                "Attribute arch of node cpu not found",
            ],
            "nccl.topology_detection_failed",
            Category.CUDA_SOFTWARE,
        ),
    ],
)
def test_nccls_own_topology_failing_is_for_a_person(
    tmp_path: Path, lines: list[str], rule: str, category: Category
) -> None:
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.rule_ids[0] == rule
    assert (diagnosis.category, diagnosis.action) == (category, Action.ESCALATE)


@pytest.mark.parametrize(
    "line",
    [
        # benign g-262: a path NCCL notes at INFO level and goes past.
        "tf2-horovod-0:262:351 [0] NCCL INFO Could not find real path of "
        "/sys/class/net/eth0/device",
        # An optional attribute NCCL reads and does without (NVIDIA/nccl#601).
        "gpu01:1234:1240 [0] NCCL INFO Attribute coll of node net not found",
        # The error code of NVML or of a peer climbing through topo.cc is not the topology's
        # (review 27).
        "gpu01:1234:1240 [0] NCCL INFO graph/topo.cc:671 -> 2",
    ],
)
def test_what_nccls_topology_goes_past_or_carries_is_not_its_failure(line: str) -> None:
    assert "nccl.topology_detection_failed" not in _rules_matching(line)


def test_a_hex_net_id_is_read_too() -> None:
    assert "nccl.topology_no_net" in _rules_matching(
        "graph/topo.h:230 NCCL WARN Could not find NET with id a"
    )


def test_nvshmem_failing_to_initialise_is_for_a_person(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "2025-12-15 14:39:19.057911428  [s6]: /dvs/p4/build/sw/rel/gpgpu/toolkit/r12.8/"
            "main_nvshmem/src/host/topo/topo.cpp:469: [GPU 4] Peer GPU 8 is not accessible, "
            "exiting ...",
            "2025-12-15 14:39:19.180245959  [s6]: /dvs/p4/build/sw/rel/gpgpu/toolkit/r12.8/"
            "main_nvshmem/src/host/init/init.cu:nvshmemi_check_state_and_init:1117: nvshmem "
            "initialization failed, exiting ",
        ],
    )  # tune g-1190
    assert diagnosis.rule_ids == ["cuda.nvshmem_init_failed"]
    assert (diagnosis.category, diagnosis.action) == (Category.CUDA_SOFTWARE, Action.ESCALATE)


def test_the_wait_for_the_nccl_id_in_newer_words_is_the_stores(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "torch.distributed.DistBackendError: [3] is setting up NCCL communicator and "
            "retrieving ncclUniqueId from [0] via c1",
            "0d key-value store by key '0', but store->get('0') got error: wait timeout after "
            "1800000ms, keys: /default_pg/0//cuda//0",
        ],
    )  # tune g-1191, wrapped as published
    assert diagnosis.rule_ids[0] == "torch.store_timeout"
    assert diagnosis.action is Action.ESCALATE
