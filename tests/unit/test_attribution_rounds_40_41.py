"""Rules from the tune cases of rounds 40 (hangs and data loaders, configuration and
checkpoint errors, network and Slurm endings) and 41 (less-used frameworks, CUDA runtime
errors, memory and storage), in the formats of the tools that print them (MosaicML
Streaming's util.py, huggingface_hub and requests, Megatron's checkpointing.py,
TensorFlow's and XLA's BFC allocator, PaddlePaddle's reader, py-lmdb, imageio, glibc,
DeepSpeed's cuBLAS wrappers, CPython's multiprocessing). The lines are composed in those
formats: these tests show behaviour, not accuracy."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.attribution_support import diagnose
from trainmedic.domain import Action, Category

STREAMING_LEADER = [
    "RuntimeError: Waiting for local rank 0, bailing out: 60.000 < 60.053 sec.",
    "Exception ignored in: <function StreamingDataset.__del__ at 0x14c8a55131c0>",
    "Traceback (most recent call last):",
    '  File "/env/lib/python3.10/site-packages/streaming/base/dataset.py", line 851, in __del__',
    "    wait_for_local_leader(world)",
    "RuntimeError: Waiting for local rank 0, bailing out: 60.000 < 60.055 sec.",
    "ERROR:composer.cli.launcher:Global rank 0 (PID 1003409) exited with code -15",
]


def test_a_rank_that_gave_up_on_its_local_leader_is_a_hang_not_a_bug(tmp_path: Path) -> None:
    """The generic RuntimeError rule would stop the chain on the owner's code; the
    message says another rank (the node's leader) never got there."""
    diagnosis = diagnose(tmp_path, STREAMING_LEADER)
    assert diagnosis.category is Category.HANG
    assert diagnosis.action is Action.RESTART
    assert diagnosis.rule_ids[0] == "dataloader.streaming_leader_timeout"


def test_the_leaders_own_error_explains_more_than_the_wait(tmp_path: Path) -> None:
    lines = [
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        *STREAMING_LEADER,
    ]
    diagnosis = diagnose(tmp_path, lines)
    assert diagnosis.category is Category.OOM_GPU
    assert diagnosis.action is Action.STOP


# (what, the tool's lines, category, action, the rule that decides)
IN_THE_TOOLS_OWN_WORDS = [
    (
        "hub-5xx",
        [
            "huggingface_hub.utils._errors.HfHubHTTPError: 500 Server Error: Internal Server "
            "Error for url: https://huggingface.co/datasets/a/b/resolve/91e6/train/"
            "train-02618-of-04012.parquet (Request ID: Root=1-65b18b81)",
        ],
        Category.DATA_LOADER,
        Action.RESTART,
        "dataloader.hub_server_error",
    ),
    (
        "megatron-layout",
        [
            '  File "/ws/megatron/checkpointing.py", line 58, in _compare',
            "    assert checkpoint_value == args_value, error_message",
            "AssertionError: tensor_model_parallel_size value from checkpoint (1) is not equal "
            "to the input argument value (2).",
        ],
        Category.CHECKPOINT,
        Action.STOP,
        "checkpoint.resume_mismatch",
    ),
    (
        "xla-bfc",
        [
            "2025-08-05 12:33:53.958194: W external/xla/xla/tsl/framework/bfc_allocator.cc:501]"
            " Allocator (GPU_2_bfc) ran out of memory trying to allocate 91.27GiB (rounded to"
            " 98000028160)requested by op ",
            "Current allocation summary follows.",
        ],
        Category.OOM_GPU,
        Action.STOP,
        "oom.gpu_torch",
    ),
    (
        "tf1-oom",
        [
            "ResourceExhaustedError (see above for traceback): OOM when allocating tensor with"
            " shape[256,112,112,64]",
            '     [[Node: Conv2d_1a_7x7/BatchNorm = SquaredDifference[T=DT_FLOAT, _device="/job:'
            'localhost/replica:0/task:0/gpu:0"](Conv2d_1a_7x7/Conv2D)]]',
        ],
        Category.OOM_GPU,
        Action.STOP,
        "oom.gpu_torch",
    ),
    (
        "paddle-reader-killed",
        [
            "SystemError: (Fatal) DataLoader process (pid 1104) exited is killed by signal:"
            " Killed. (at /paddle/paddle/fluid/imperative/data_loader.cc:181)",
        ],
        Category.OOM_HOST,
        Action.STOP,
        "dataloader.worker_killed",
    ),
    (
        "lmdb-readers-full",
        [
            "lmdb.ReadersFullError: Caught ReadersFullError in DataLoader worker process 0.",
            "Original Traceback (most recent call last):",
            "lmdb.ReadersFullError: mdb_txn_begin: MDB_READERS_FULL: Environment maxreaders"
            " limit reached",
        ],
        Category.DATA_LOADER,
        Action.STOP,
        "dataloader.lmdb_readers_full",
    ),
    (
        "imageio-unreadable",
        ["ValueError: Could not find a format to read the specified file in mode 'i'"],
        Category.DATA_LOADER,
        Action.STOP,
        "dataloader.unreadable_sample",
    ),
    (
        "deepspeed-cublas",
        ["!!!! kernel execution error. (m: 768, n: 1, k: 256, error: 13) "] * 3,
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
        "cuda.library_failure",
    ),
    (
        "thc-cuda-runtime-error",
        [
            "RuntimeError: cuda runtime error (101) : invalid device ordinal at"
            " /opt/pytorch/pytorch/torch/csrc/cuda/Module.cpp:33",
        ],
        Category.CUDA_SOFTWARE,
        Action.ESCALATE,
        "cuda.generic_error",
    ),
]


@pytest.mark.parametrize(
    ("lines", "category", "action", "rule"),
    [case[1:] for case in IN_THE_TOOLS_OWN_WORDS],
    ids=[case[0] for case in IN_THE_TOOLS_OWN_WORDS],
)
def test_each_tools_own_words_decide(
    tmp_path: Path, lines: list[str], category: Category, action: Action, rule: str
) -> None:
    diagnosis = diagnose(tmp_path, lines)
    assert (diagnosis.category, diagnosis.action) == (category, action), diagnosis.rule_ids
    assert diagnosis.rule_ids[0] == rule


def test_the_programs_retries_around_a_server_error_do_not_make_it_a_bug(tmp_path: Path) -> None:
    """The job retried and gave up with its own RuntimeError; the cause is still the
    server's (the restart budget ends a server that stays down)."""
    diagnosis = diagnose(
        tmp_path,
        [
            "huggingface_hub.errors.HfHubHTTPError: 503 Server Error: Service Unavailable",
            "",
            "The above exception was the direct cause of the following exception:",
            "",
            "Traceback (most recent call last):",
            '  File "train.py", line 10, in <module>',
            "RuntimeError: Failed to load shard 17 after 3 attempts",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.DATA_LOADER, Action.RESTART)


def test_a_client_error_of_the_dataset_host_is_not_a_server_error(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "huggingface_hub.utils._errors.HfHubHTTPError: 404 Client Error: Not Found for "
            "url: https://huggingface.co/datasets/a/b/resolve/main/missing.parquet",
        ],
    )
    assert "dataloader.hub_server_error" not in diagnosis.rule_ids
    assert diagnosis.action is not Action.RESTART


def test_the_bfc_allocators_retry_is_no_failure(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "2021-11-06 15:58:24.802601: W tensorflow/core/common_runtime/bfc_allocator.cc:246]"
            " Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.27GiB with"
            " freed_by_count=0. The caller indicates that this is not a failure, but may mean"
            " that there could be performance gains if more memory were available.",
        ],
    )
    assert diagnosis.category is Category.UNKNOWN


def test_a_cpp_allocation_failure_is_for_a_person(tmp_path: Path) -> None:
    """std::bad_alloc at launch is as often a corrupt size as a full host."""
    diagnosis = diagnose(
        tmp_path,
        [
            "terminate called after throwing an instance of 'std::bad_alloc'",
            "  what():  std::bad_alloc",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_HOST, Action.ESCALATE)
    # Python's MemoryError still stops: the program's own allocation on the host.
    assert diagnose(tmp_path, ["MemoryError"]).action is Action.STOP


SPAWN_CHILD = [
    "Traceback (most recent call last):",
    '  File "<string>", line 1, in <module>',
    '  File "/usr/lib/python3.6/multiprocessing/spawn.py", line 105, in spawn_main',
    "    exitcode = _main(fd)",
    '  File "/usr/lib/python3.6/multiprocessing/spawn.py", line 115, in _main',
    "    self = reduction.pickle.load(from_parent)",
]


def test_a_spawned_child_whose_parent_died_is_no_corrupt_checkpoint(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "terminate called after throwing an instance of 'std::system_error'",
            "  what():  Transport endpoint is not connected",
            *SPAWN_CHILD,
            "_pickle.UnpicklingError: pickle data was truncated",
            *SPAWN_CHILD,
            "EOFError: Ran out of input",
        ],
    )
    assert diagnosis.category is Category.NETWORK_NCCL
    assert diagnosis.action is Action.RESTART
    assert "checkpoint.corrupt" not in diagnosis.rule_ids


def test_a_spawned_child_out_of_memory_while_unpickling_is_host_memory(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, [*SPAWN_CHILD, "MemoryError"])
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_HOST, Action.STOP)


def test_a_truncated_checkpoint_read_by_the_program_is_still_corrupt(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "Traceback (most recent call last):",
            '  File "train.py", line 40, in <module>',
            '    state = torch.load("ckpt/last.pt")',
            "EOFError: Ran out of input",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.CHECKPOINT, Action.STOP)


def test_a_mount_that_lost_its_server_is_still_storage(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path, ["OSError: [Errno 107] Transport endpoint is not connected: '/mnt/data'"]
    )
    assert diagnosis.category is Category.STORAGE_IO


@pytest.mark.parametrize(
    "line",
    [
        "*** Error in `python': malloc(): smallbin double linked list corrupted: 0x00007f9d ***",
        "double free or corruption (!prev)",
        "[rank2]: free(): invalid pointer",
    ],
)
def test_heap_corruption_alone_is_for_a_person(tmp_path: Path, line: str) -> None:
    diagnosis = diagnose(tmp_path, [line, "Signal: Aborted (6)"])
    assert diagnosis.action is Action.ESCALATE
    assert "proc.heap_corruption" in diagnosis.rule_ids


def test_heap_corruption_at_the_teardown_does_not_hide_the_failure(tmp_path: Path) -> None:
    """A process group's destructor aborting in glibc after NCCL lost its peer."""
    diagnosis = diagnose(
        tmp_path,
        [
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:2027,"
            " remote process exited or there was a network error, NCCL version 2.21.5",
            "corrupted double-linked list",
            "Signal: Aborted (6)",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.RESTART)


def test_a_leader_wait_raised_at_the_teardown_hides_no_bug(tmp_path: Path) -> None:
    """Streaming waits for its leader in __del__: after the program's own error, the
    finaliser's timeout is the teardown, not a hang."""
    diagnosis = diagnose(
        tmp_path,
        [
            "Traceback (most recent call last):",
            '  File "train.py", line 80, in <module>',
            "RuntimeError: Invalid mt19937 state",
            *STREAMING_LEADER[1:6],
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.USER_CODE, Action.STOP)


def test_deepspeeds_autotuner_refusals_decide_nothing(tmp_path: Path) -> None:
    """The GEMM autotuner prints the wrapper's line for each algorithm cuBLAS does not
    support, ignores it, and the run goes on."""
    diagnosis = diagnose(
        tmp_path,
        [
            "!!!! kernel execution error. (m: 768, n: 1, k: 256, error: 15) ",
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:2027,"
            " remote process exited or there was a network error, NCCL version 2.21.5",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.RESTART)


def test_a_retry_wrappers_log_of_a_server_error_is_not_the_error(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path, ["WARNING:data: attempt 1 failed: HfHubHTTPError: 500 Server Error -> retry"]
    )
    assert "dataloader.hub_server_error" not in diagnosis.rule_ids


def test_old_pytorchs_out_of_memory_is_a_gpu_oom(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "RuntimeError: cuda runtime error (2) : out of memory at"
            " /pytorch/aten/src/THC/THCCachingAllocator.cpp:510",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_GPU, Action.STOP)


def test_python_314s_unraisable_header_is_read_as_the_old_one(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:2027,"
            " remote process exited or there was a network error, NCCL version 2.21.5",
            "Exception ignored while calling deallocator <function"
            " _MultiProcessingDataLoaderIter.__del__ at 0x7f3a2c1e0ca0>:",
            "Traceback (most recent call last):",
            '  File "/env/torch/utils/data/dataloader.py", line 1477, in __del__',
            "AssertionError: can only test a child process",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.NETWORK_NCCL, Action.RESTART)


@pytest.mark.parametrize(
    "saving",
    [
        "Summoning checkpoint.",
        "2024-08-19 07:57:06 INFO saving checkpoint: /out/model-step00000600.safetensors",
        "[INFO|trainer.py:3410] Saving model checkpoint to out/checkpoint-500",
    ],
)
def test_a_sigkill_while_a_checkpoint_is_saved_is_host_memory(tmp_path: Path, saving: str) -> None:
    diagnosis = diagnose(
        tmp_path,
        [saving, "Killed"],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_HOST, Action.STOP)


def test_a_sigkill_long_after_a_save_stays_for_a_person(tmp_path: Path) -> None:
    steps = [f"step {n}: loss 0.{n:03d}" for n in range(20)]
    diagnosis = diagnose(
        tmp_path, ["Saving model checkpoint to out/checkpoint-500", *steps, "Killed"]
    )
    assert (diagnosis.category, diagnosis.action) == (Category.OOM_HOST, Action.ESCALATE)
