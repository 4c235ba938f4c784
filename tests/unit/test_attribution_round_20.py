"""Round 20 on tests/corpus/real/tune: stack dumps in a library's own collectives, CUDA's
older wording for a busy GPU, and names that only look like hosts.

Lines quoted from a tune case name it; the others follow the tools' own formats.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.attribution_support import diagnose
from trainmedic.domain import Action, Category

# tune/g-076.log: py-spy of a GRPO trainer's GPU 0, parked in vLLM's all-reduce.
VLLM_DUMP = [
    "    __call__ (torch/_ops.py:1209)",
    "    all_reduce (vllm/distributed/device_communicators/symm_mem.py:148)",
    "    all_reduce (vllm/distributed/device_communicators/cuda_communicator.py:201)",
    "    _all_reduce_out_place (vllm/distributed/parallel_state.py:514)",
]


def test_a_dump_inside_a_librarys_collective_is_a_hang(tmp_path: Path) -> None:
    diagnosis = diagnose(tmp_path, VLLM_DUMP)
    assert diagnosis.category is Category.HANG
    assert diagnosis.rule_ids[0] == "hang.stack_dump_in_collective"


@pytest.mark.parametrize(
    "frame",
    [
        # A profile of a healthy step: frames of other modules named like collectives.
        "    broadcast_tensors (torch/functional.py:77)",
        "    wait (threading.py:324)",
        "    recv (multiprocessing/connection.py:250)",
        "    all_reduce_metrics (myproject/common/metrics.py:41)",
    ],
)
def test_frames_outside_a_communication_layer_are_not_a_hang(tmp_path: Path, frame: str) -> None:
    assert diagnose(tmp_path, [frame]).category is Category.UNKNOWN


def test_cudas_older_wording_for_a_busy_gpu(tmp_path: Path) -> None:
    # tune/g-123.log: a stray process held the allocated GPU (CUDA 9 era PyTorch).
    line = (
        "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCTensorRandom.cu line=25 error=46 : "
        "all CUDA-capable devices are busy or unavailable"
    )
    diagnosis = diagnose(tmp_path, [line])
    assert diagnosis.rule_ids[0] == "cuda.device_busy"
    # No node is named, so there is none to keep away from: a plain restart.
    assert (diagnosis.category, diagnosis.action) == (Category.GPU_HARDWARE, Action.RESTART)


@pytest.mark.parametrize(
    "line",
    [
        "python3: can't open file '/home/u/train.py': [Errno 2] No such file or directory",
        "urllib3.exceptions.ReadTimeoutError: HTTPSConnectionPool(host='cdn-lfs.huggingface.co',"
        " port=443): Read timed out.",
        "urllib3.connectionpool: Retrying after connection broken by 'ProtocolError'\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ],
)
def test_programs_packages_and_exceptions_are_not_hosts(tmp_path: Path, line: str) -> None:
    assert diagnose(tmp_path, line.split("\n")).culprit_nodes == []


def test_a_host_prefix_still_names_its_host(tmp_path: Path) -> None:
    line = "gpu03.cluster: RuntimeError: CUDA error: an illegal memory access was encountered"
    assert diagnose(tmp_path, [line]).culprit_nodes == ["gpu03"]
