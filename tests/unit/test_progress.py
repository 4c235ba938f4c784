"""Progress patterns on real trainer output, checkpoint markers, and the hang state."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from trainmedic.watchers.progress import (
    JobProgress,
    ProgressConfig,
    ProgressPatterns,
    SeenLine,
    checkpoint_marker,
)

PATTERNS = ProgressPatterns(ProgressConfig())


@pytest.mark.parametrize(
    "line",
    [
        "[rank0]: step 123 loss 2.31 lr 3e-4",
        "Step 5/100 | loss=1.2",
        "global_step=4000 train/loss=1.9",
        " iteration      100/    1000 | consumed samples:        12800 | elapsed time per "
        "iteration (ms): 512.3 | learning rate: 3.000E-04 | lm loss: 6.123E+00 |",
        "Epoch 3:  45%|████▌     | 450/1000 [02:13<02:43,  3.37it/s, v_num=0, loss=2.31]",
        "{'loss': 2.3456, 'grad_norm': 1.02, 'learning_rate': 4.9e-05, 'epoch': 0.12}",
        "epoch=2 batch 17",
        " 12%|█▏        | 120/1000 [00:31<03:50, 3.82 it/s]",
        "iter: 7, loss 0.3",
        "[rank0]: step 5/100 | loss 2.3012 | 1.0 it/s",  # `trainmedic lab train`
    ],
)
def test_default_patterns_see_common_trainer_output(line: str) -> None:
    progress, _ = PATTERNS.scan(line.encode(), 0)
    assert progress is not None, line


@pytest.mark.parametrize(
    "line",
    [
        "  max_steps=1000 warmup_steps=100 save_steps=500",
        "  Total optimization steps = 4,000",
        "  Num Epochs = 3",
        "NCCL INFO comm 0x55 rank 3 nranks 16 cudaDev 3 busId 41000 - Init COMPLETE",
        "[rank7]:[E1016 04:12:55.883417112 ProcessGroupNCCL.cpp:616] [Rank 7] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=88211, OpType=ALLREDUCE)",
        "Loading checkpoint shards: done",
    ],
)
def test_config_echo_and_errors_are_not_progress(line: str) -> None:
    progress, checkpoint = PATTERNS.scan(line.encode(), 0)
    assert progress is None and checkpoint is None, line


@pytest.mark.parametrize(
    ("line", "marker"),
    [
        ("[rank0]: saved checkpoint at step 1200 to /ckpt/step-1200", "checkpoint@1200"),
        (
            "successfully saved checkpoint from iteration    1000 to /lustre/ckpt",
            "checkpoint@1000",
        ),
        ("Saving model checkpoint to out/checkpoint-500", "checkpoint@500"),
        (
            "Epoch 3, global step 4000: 'val_loss' reached 0.50 (best 0.50), saving model to "
            "'/x/epoch=3-step=4000.ckpt' as top 1",
            "checkpoint@4000",
        ),
        ("[Torch] Checkpoint global_step1000 is ready now!", "checkpoint@1000"),
        ("[rank0]: saved checkpoint at step 10", "checkpoint@10"),  # `trainmedic lab train`
    ],
)
def test_checkpoint_lines_and_their_step(line: str, marker: str) -> None:
    _, checkpoint = PATTERNS.scan(line.encode(), 0)
    assert checkpoint is not None
    assert checkpoint.marker == marker == checkpoint_marker(line)


def test_last_progress_in_a_block_wins_and_carriage_returns_split_bars() -> None:
    block = b"".join(b"step %d loss 1.0\n" % i for i in range(2000))
    progress, _ = PATTERNS.scan(block, 0)
    assert progress is not None and progress.marker == "step 1999"
    bar = b"Epoch 0:  10%| | 10/100 [00:01<00:09]\rEpoch 0:  11%| | 11/100 [00:01<00:08]"
    progress, _ = PATTERNS.scan(bar, 0)
    assert progress is not None and progress.line.startswith("Epoch 0:  11%")
    early = b"step 5 early\n" + b"unrelated output line\n" * 10_000  # found past the tail window
    progress, _ = PATTERNS.scan(early, 0)
    assert progress is not None and progress.marker == "step 5"


def test_custom_patterns_and_bad_pattern() -> None:
    patterns = ProgressPatterns(ProgressConfig(patterns=[], extra_patterns=[r"tick \d+"]))
    assert patterns.scan(b"step 5\n", 0) == (None, None)
    progress, _ = patterns.scan(b"tick 9\n", 0)
    assert progress is not None and progress.marker == "tick 9"
    with pytest.raises(ValueError, match="bad progress pattern"):
        ProgressConfig(extra_patterns=["(unclosed"])
    assert ProgressConfig.model_validate({"hang_after": "2s"}).hang_after.total_seconds() == 2


def _seen(text: str) -> SeenLine:
    return SeenLine(text, "f", 1, datetime.now(UTC))


def test_hang_once_per_stall_and_rearmed_by_progress() -> None:
    job = JobProgress()
    assert not job.check_hang(1000.0, 10)  # never progressed: no hang, whatever the time
    assert job.observe("step 1", _seen("step 1"), 0.0)
    assert not job.check_hang(9.0, 10)
    assert job.check_hang(10.0, 10)
    assert not job.check_hang(500.0, 10)  # one report per stall
    assert not job.observe("step 1", _seen("step 1"), 501.0)  # reprinting is not progress
    assert not job.check_hang(600.0, 10)
    assert job.observe("step 2", _seen("step 2"), 601.0)
    assert not job.check_hang(605.0, 10)
    assert job.check_hang(611.0, 10) and job.stalls == 2


def test_checkpoint_is_kept_and_counts_as_progress() -> None:
    job = JobProgress()
    job.observe("step 1199", _seen("step 1199"), 0.0)
    job.observe_checkpoint("checkpoint@1200", _seen("saved checkpoint at step 1200"), 5.0)
    assert job.checkpoint == "checkpoint@1200" and job.summary == "checkpoint@1200"
    assert job.stalled_for(6.0) == 1.0
