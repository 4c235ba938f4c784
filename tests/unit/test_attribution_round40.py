"""Rules from round 40's tune cases (hangs and data loaders, configuration and checkpoint
errors, network and Slurm endings), in the formats of the tools that print them
(MosaicML Streaming's util.py, huggingface_hub and requests, Megatron's checkpointing.py).
The lines are composed in those formats: these tests show behaviour, not accuracy."""

from __future__ import annotations

from pathlib import Path

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


def test_a_server_error_of_the_dataset_host_restarts(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            "huggingface_hub.utils._errors.HfHubHTTPError: 500 Server Error: Internal Server "
            "Error for url: https://huggingface.co/datasets/a/b/resolve/91e6/train/"
            "train-02618-of-04012.parquet (Request ID: Root=1-65b18b81)",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.DATA_LOADER, Action.RESTART)
    assert diagnosis.transient is True


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


def test_a_checkpoint_saved_with_another_parallel_layout_stops(tmp_path: Path) -> None:
    diagnosis = diagnose(
        tmp_path,
        [
            '  File "/ws/megatron/checkpointing.py", line 58, in _compare',
            "    assert checkpoint_value == args_value, error_message",
            "AssertionError: tensor_model_parallel_size value from checkpoint (1) is not equal "
            "to the input argument value (2).",
        ],
    )
    assert (diagnosis.category, diagnosis.action) == (Category.CHECKPOINT, Action.STOP)
    assert diagnosis.rule_ids[0] == "checkpoint.resume_mismatch"
