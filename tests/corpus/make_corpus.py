"""Writes the labelled attribution corpus (run once; the outputs are committed).

Each case imitates the real shapes of PyTorch / NCCL / CUDA / Slurm / kernel logs;
the messages are written for this corpus, not copied from public logs.
Usage: python tests/corpus/make_corpus.py  (rewrites tests/corpus/cases + labels.jsonl)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
CASES = HERE / "cases"
rng = random.Random(20251129)
labels: list[dict] = []


def ts(i: int) -> str:
    return f"2025-03-{12 + i // 86400:02d} {(i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}"


def megatron(it0: int, n: int, prefix: str = "") -> list[str]:
    out = []
    for it in range(it0, it0 + n):
        loss = 2.9 - it * 0.0004 + rng.random() * 0.05
        out.append(
            f"{prefix} [{ts(it * 7)}] iteration {it:>7}/  500000 | consumed samples: {it * 1024:>10} | "
            f"elapsed time per iteration (ms): {780 + rng.random() * 40:.1f} | learning rate: 2.{rng.randint(100, 999)}E-04 | "
            f"global batch size:  1024 | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {0.2 + rng.random() * 0.3:.3f} | "
            f"number of skipped iterations:   0 | number of nan iterations:   0 |".lstrip()
        )
    return out


def hf_trainer(step0: int, n: int) -> list[str]:
    out = []
    for s in range(step0, step0 + n):
        out.append(
            f"{{'loss': {1.2 + rng.random() * 0.4:.4f}, 'grad_norm': {0.5 + rng.random():.4f}, "
            f"'learning_rate': {1e-5 * (1 - s / 10000):.3e}, 'epoch': {s / 1500:.2f}}}"
        )
        if s % 7 == 0:
            out.append(f" {s * 100 // 10000}%|##        | {s}/10000 [1:{s % 60:02d}:10<9:12:00,  3.41s/it]")
    return out


def nccl_init(host: str, ranks: range, pid0: int) -> list[str]:
    out = []
    for r in ranks:
        pid = pid0 + r
        out.append(f"{host}:{pid}:{pid} [{r % 8}] NCCL INFO Bootstrap : Using ibp26s0:10.12.0.{ranks.start // 8 + 11}<0>")
        out.append(f"{host}:{pid}:{pid + 97} [{r % 8}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB ; OOB ibp26s0:10.12.0.{ranks.start // 8 + 11}<0>")
        out.append(f"{host}:{pid}:{pid + 97} [{r % 8}] NCCL INFO comm 0x5581c2a0 rank {r} nranks 32 cudaDev {r % 8} busId {0x18 + r % 8 * 0x10:x}000 - Init COMPLETE")
    return out


def write(name: str, lines: list[str] | dict[str, list[str]], **label) -> None:
    path = CASES / name
    if isinstance(lines, dict):
        path.mkdir(parents=True, exist_ok=True)
        for sub, body in lines.items():
            (path / sub).write_text("\n".join(body) + "\n")
    else:
        path.write_text("\n".join(lines) + "\n")
    labels.append({"file": f"cases/{name}", **label})


def watchdog(rank: int, seq: int, op: str = "ALLREDUCE") -> list[str]:
    return [
        f"[rank{rank}]:[E312 10:{rank % 60:02d}:11.{rng.randint(100000, 999999)} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for {600000 + rng.randint(5, 900)} milliseconds before timing out.",
        f"[rank{rank}]:[E312 10:20:11.{rng.randint(100000, 999999)} ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] Timeout at NCCL work: {seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.",
        f"[rank{rank}]:[E312 10:20:11.{rng.randint(100000, 999999)} ProcessGroupNCCL.cpp:667] [Rank {rank}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        f"[rank{rank}]:[E312 10:20:11.{rng.randint(100000, 999999)} ProcessGroupNCCL.cpp:673] [Rank {rank}] To avoid data inconsistency, we are taking the entire process down.",
    ]


def elastic_summary(host: str, rank: int, local: int, code: int, sig: str | None) -> list[str]:
    tb = f"Signal {-code} ({sig}) received by PID {40000 + rank}" if sig else "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
    return [
        "Traceback (most recent call last):",
        '  File "/usr/local/bin/torchrun", line 8, in <module>',
        "    sys.exit(main())",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "pretrain_gpt.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2025-03-12_10:20:14",
        f"  host      : {host}",
        f"  rank      : {rank} (local_rank: {local})",
        f"  exitcode  : {code} (pid: {40000 + rank})",
        "  error_file: <N/A>",
        f"  traceback : {tb}",
        "============================================================",
    ]


def slurm_tail(job: int, node: str, reason: str | None = None) -> list[str]:
    due = f" DUE TO {reason}" if reason else ""
    return [f"slurmstepd: error: *** JOB {job} ON {node} CANCELLED AT 2025-03-12T10:21:0{rng.randint(0, 9)}{due} ***"]


NODES4 = "gpu[01-04]"
H = ["gpu01", "gpu02", "gpu03", "gpu04"]


def xid_line(host: str, xid: int, msg: str, bus: str = "0000:3b:00") -> str:
    return f"Mar 12 10:19:{rng.randint(10, 59)} {host} kernel: NVRM: Xid (PCI:{bus}): {xid}, {msg}"


def main() -> None:
    CASES.mkdir(parents=True, exist_ok=True)
    for old in CASES.rglob("*"):
        if old.is_file():
            old.unlink()

    # ---- GPU hardware: multi-rank cascades with one culprit node ------------------------
    for n, (culprit, xid, msg, cat) in enumerate(
        [
            ("gpu03", 79, "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", "gpu_hardware"),
            ("gpu02", 48, "pid=88121, name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 3, subpartition 0.", "gpu_memory_ecc"),
            ("gpu04", 95, "pid=51002, name=pt_main_thread, Uncontained: SM ECC. RST: No, D-RST: No", "gpu_memory_ecc"),
            ("gpu01", 74, "pid=1201, name=python, NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)", "nvlink_fabric"),
            ("gpu03", 119, "pid=77110, name=python, Timeout after 6s of waiting for RPC response from GPU2 GSP! Expected function 76 (GSP_RM_CONTROL)", "gpu_hardware"),
            ("gpu02", 145, "pid=4410, name=python, RLW_REMAP Nonfatal XC0 i0 Link 07 (0x00000000 0x00000000 0x00000000)", "nvlink_fabric"),
        ]
    ):
        files: dict[str, list[str]] = {}
        out = megatron(1200, 30)
        for r in range(32):
            if H[r // 8] != culprit:
                out += watchdog(r, 88000 + n)[: 1 + r % 3]
        out += elastic_summary(H[(H.index(culprit) + 1) % 4], 9, 1, -6, "SIGABRT")
        out += [f"srun: error: {h}: tasks {i * 8}-{i * 8 + 7}: Exited with exit code 1" for i, h in enumerate(H) if h != culprit]
        files["slurm-551289.out"] = out
        files[f"kern-{culprit}.log"] = [
            f"Mar 12 10:18:{rng.randint(10, 59)} {culprit} kernel: nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
            xid_line(culprit, xid, msg),
            f"Mar 12 10:19:59 {culprit} systemd[1]: Started Session 412 of user slurm.",
        ]
        action = "drain_node_and_restart"
        write(f"{n + 1:03d}-xid{xid}-cascade", files, category=cat, culprit=culprit, transient=False, expected_action=action, nodelist=NODES4, tasks_per_node=8)

    # ECC seen by the app only, rank -> node mapping via srun -l labels
    out = megatron(400, 20, prefix="")
    out = [f"{r % 16:>2}: {line}" for r, line in enumerate(out)]
    out += [" 13: [rank13]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
            " 13: [rank13]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
            " 13: [rank13]: For debugging consider passing CUDA_LAUNCH_BLOCKING=1"]
    out += [f" {r}: " + line for r in (0, 4, 8) for line in watchdog(r, 4411)[:2]]
    out += ["srun: error: gpu02: task 13: Exited with exit code 1"]
    write("007-ecc-app-srun-labels.log", out, category="gpu_memory_ecc", culprit="gpu02", transient=False, expected_action="drain_node_and_restart", nodelist="gpu[01-02]", tasks_per_node=8)

    # Xid 79 app-side view + NVML-style GPU lost
    out = hf_trainer(100, 30) + [
        "[default3]:Traceback (most recent call last):",
        '[default3]:  File "train.py", line 210, in <module>',
        "[default3]:RuntimeError: CUDA error: unspecified launch failure",
        "[default3]:Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        "Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error",
    ] + slurm_tail(88123, "node17")
    write("008-gpu-lost-single-node.log", out, category="gpu_hardware", culprit=None, transient=False, expected_action="drain_node_and_restart")

    # Xid 79 in a multi-file case where the app only shows a launch failure
    write("009-launch-failure-with-xid", {
        "rank-logs.txt": megatron(50, 10, "[rank0]:") + ["[rank6]:RuntimeError: CUDA error: unspecified launch failure"] + watchdog(0, 77) + watchdog(1, 77),
        "dmesg-gpu01.txt": ["[1234567.890123] NVRM: GPU at PCI:0000:ca:00: GPU-7d1c2f0e-55aa-4cc9-9a5b-1f0e2d3c4b5a",
                            "[1234567.890456] NVRM: Xid (PCI:0000:ca:00): 79, pid=<unknown>, name=<unknown>, GPU has fallen off the bus.",
                            "[1234567.890789] NVRM: GPU 0000:ca:00.0: GPU has fallen off the bus."],
    }, category="gpu_hardware", culprit=None, transient=False, expected_action="drain_node_and_restart")

    # Xid 13 / 31: application bugs -> restart (not drain)
    write("010-xid31-mmu-fault-app.log", [
        "Mar 12 10:19:03 gpu02 kernel: NVRM: Xid (PCI:0000:b3:00): 31, pid=88121, name=python, Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_3 faulted @ 0x7f1d_2a000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        "[rank10]: RuntimeError: CUDA error: an illegal memory access was encountered",
        "[rank10]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
    ] + watchdog(3, 1201)[:1], category="cuda_software", culprit=None, transient=True, expected_action="restart", nodelist=NODES4, tasks_per_node=8)
    write("011-xid13-graphics-exception.log", [
        "Mar 12 09:01:44 gpu04 kernel: NVRM: Xid (PCI:0000:4e:00): 13, pid=3312, name=python3, Graphics Exception: ESR 0x404600=0x80000001",
        "Mar 12 09:01:44 gpu04 kernel: NVRM: Xid (PCI:0000:4e:00): 13, pid=3312, name=python3, Graphics SM Warp Exception on (GPC 1, TPC 4, SM 0): Out Of Range Address",
        "[rank28]:RuntimeError: CUDA error: an illegal memory access was encountered",
    ], category="cuda_software", culprit=None, transient=True, expected_action="restart", nodelist=NODES4, tasks_per_node=8)
    # Xid 63 row remap pending is informational; the real failure is a user bug
    write("012-xid63-informational-plus-user-bug.log", [
        "Mar 12 08:00:01 gpu01 kernel: NVRM: Xid (PCI:0000:18:00): 63, pid=2210, name=python, Row Remapper: New row (0x0000000000ab1234) Marked for Remapping, reset gpu to activate.",
    ] + megatron(10, 5) + [
        "Traceback (most recent call last):",
        '  File "/workspace/megatron/training/arguments.py", line 388, in validate_args',
        "AssertionError: num_layers (30) must be divisible by pipeline-model-parallel size (4)",
    ], category="user_code", culprit=None, transient=False, expected_action="stop_job")
    # Xid 154 recovery action
    write("013-xid154-reset-required.log", [
        "Mar 12 11:01:22 gpu03 kernel: NVRM: Xid (PCI:0000:9a:00): 62, 0e3a1b22 00002100 00000000 20662342",
        "Mar 12 11:01:22 gpu03 kernel: NVRM: Xid (PCI:0000:9a:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        "Mar 12 11:01:23 gpu03 kernel: NVRM: Xid (PCI:0000:9a:00): 45, pid=12542, name=python, channel 0x00000002",
    ], category="gpu_hardware", culprit="gpu03", transient=False, expected_action="drain_node_and_restart", nodelist=NODES4, tasks_per_node=8)
    # SXid / fabric
    write("014-nvswitch-sxid.log", [
        "Mar 12 12:00:01 gpu02 kernel: nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Fatal, Link 44 LTSSM Fault Up",
        "Mar 12 12:00:01 gpu02 kernel: nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 20034, Severity 1 Engine instance 44 Sub-engine instance 00",
        "[rank9]:[E ProcessGroupNCCL.cpp:1534] [PG 0 Rank 9] NCCL watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered",
    ], category="nvlink_fabric", culprit="gpu02", transient=False, expected_action="drain_node_and_restart", nodelist=NODES4, tasks_per_node=8)

    # ---- InfiniBand / network --------------------------------------------------------
    files = {
        "node-gpu03.log": nccl_init("gpu03", range(16, 20), 61000) + [
            "gpu03:61017:61222 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got async event : port error",
            "gpu03:61017:61222 [1] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.12.0.12<51021> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.12.0.13 remoteGids::ffff:10.12.0.12",
        ],
        "node-gpu01.log": nccl_init("gpu01", range(0, 4), 41000) + watchdog(0, 9001) + watchdog(2, 9001),
        "kern-gpu03.log": ["Mar 12 10:02:11 gpu03 kernel: mlx5_core 0000:4b:00.0: mlx5_port_module_event:1084: Port module event[error]: module 0, Cable error, Bus stuck (I2C or data shorted)"],
    }
    write("015-ib-port-error", files, category="infiniband_nic", culprit="gpu03", transient=False, expected_action="drain_node_and_restart", nodelist=NODES4, tasks_per_node=8)
    write("016-ib-retry-exceeded.log", nccl_init("gpu02", range(8, 10), 5000) + [
        "gpu02:5008:5301 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.12.0.14<47721> with error 12, opcode 0, len 0, vendor err 129 (Send) localGid ::ffff:10.12.0.12 remoteGids::ffff:10.12.0.14",
        "gpu02:5008:5301 [0] NCCL INFO transport/net.cc:1302 -> 6",
        "[rank8]: torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2077, remote process exited or there was a network error, NCCL version 2.21.5",
        "[rank8]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        "[rank8]: Last error:",
        "[rank8]: NET/IB : Got completion from peer 10.12.0.14<47721> with error 12, opcode 0, len 0, vendor err 129 (Send)",
    ], category="infiniband_nic", culprit="gpu02", transient=None, expected_action="restart_excluding_node", nodelist=NODES4, tasks_per_node=8)
    write("017-nccl-socket-connect.log", [
        "gpu01:33017:34012 [0] NCCL INFO Bootstrap : Using eth0:10.3.0.11<0>",
        "gpu01:33017:34012 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.3.0.12<46351> failed : Software caused connection abort",
        "gpu01:33017:34012 [0] NCCL INFO misc/socket.cc:565 -> 2",
        "[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3",
        "[rank0]: ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
    ], category="network_nccl", culprit=None, transient=True, expected_action="restart")
    write("018-rendezvous-timeout.log", [
        "W0312 10:00:01.001 4411 torch/distributed/run.py:779] *****************************************",
        "W0312 10:00:01.001 4411 torch/distributed/run.py:779] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed.",
        "[W socket.cpp:697] [c10d] The client socket has timed out after 900s while trying to connect to (gpu01, 29500).",
        "torch.distributed.DistNetworkError: The client socket has timed out after 900s while trying to connect to (gpu01, 29500).",
    ], category="network_nccl", culprit=None, transient=True, expected_action="restart")
    # watchdog-only on all ranks: thin evidence -> restart, low confidence, no culprit
    out = megatron(3000, 40, "[rank0]:")
    for r in range(16):
        out += watchdog(r, 120455, "_ALLGATHER_BASE")
    out += elastic_summary("gpu01", 0, 0, -6, "SIGABRT")
    write("019-watchdog-only-all-ranks.log", out, category="network_nccl", culprit=None, transient=True, expected_action="restart")
    write("020-gloo-peer-closed.log", megatron(10, 3) + [
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.10.3.14]:61822",
    ], category="network_nccl", culprit=None, transient=True, expected_action="restart")

    # ---- CUDA software ---------------------------------------------------------------
    write("021-no-kernel-image.log", [
        "/usr/local/lib/python3.10/dist-packages/torch/cuda/__init__.py:209: UserWarning: ",
        "NVIDIA H100 80GB HBM3 with CUDA capability sm_90 is not compatible with the current PyTorch installation.",
        "The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86.",
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
    ], category="cuda_software", culprit=None, transient=False, expected_action="stop_job")
    write("022-driver-mismatch-one-node.log", [
        "0: [rank0]: step 1 ok",
        "8: Failed to initialize NVML: Driver/library version mismatch",
        "8: NVML library version: 550.90",
        "8: RuntimeError: The NVIDIA driver on your system is too old (found version 12020). Please update your GPU driver by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx",
        "srun: error: gpu02: tasks 8-15: Exited with exit code 1",
    ], category="cuda_software", culprit="gpu02", transient=False, expected_action="drain_node_and_restart", nodelist="gpu[01-02]", tasks_per_node=8)
    write("023-illegal-address-rank5.log", megatron(70, 10, "[rank0]:") + [
        "[rank5]: Traceback (most recent call last):",
        '[rank5]:   File "/workspace/model/attention.py", line 122, in forward',
        "[rank5]:     out = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_s, max_s)",
        "[rank5]: RuntimeError: CUDA error: an illegal memory access was encountered",
        "[rank5]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
        "[rank5]: For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    ] + watchdog(0, 512) + watchdog(1, 512), category="cuda_software", culprit="rank 5", transient=True, expected_action="restart", nodelist="gpu[01-02]", tasks_per_node=8)
    write("024-device-assert.log", [
        "../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [12,0,0], thread: [64,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"` failed.",
        "RuntimeError: CUDA error: device-side assert triggered",
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    ], category="cuda_software", culprit=None, transient=True, expected_action="restart")
    write("025-segfault.log", hf_trainer(10, 10) + [
        "Fatal Python error: Segmentation fault",
        "Thread 0x00007f4c2a7fe700 (most recent call first):",
        '  File "/usr/lib/python3.10/threading.py", line 324 in wait',
        "/var/spool/slurmd/job551301/slurm_script: line 31: 771230 Segmentation fault      (core dumped) python train.py --config cfg.yaml",
    ], category="cuda_software", culprit=None, transient=True, expected_action="restart")

    # ---- OOM ----------------------------------------------------------------------
    for n, (line, name) in enumerate([
        ("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 3 has a total capacity of 79.11 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use. Of the allocated memory 74.60 GiB is allocated by PyTorch, and 1.97 GiB is reserved by PyTorch but unallocated.", "torch-new"),
        ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.53 GiB (GPU 0; 39.39 GiB total capacity; 35.12 GiB already allocated; 1.21 GiB free; 36.90 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.", "torch-old"),
        ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "cublas"),
    ]):
        write(f"{26 + n:03d}-oom-gpu-{name}.log", hf_trainer(200, 12) + ["Traceback (most recent call last):", '  File "train.py", line 88, in training_step', line], category="oom_gpu", culprit=None, transient=False, expected_action="stop_job")
    write("029-oom-gpu-nccl-buffers.log", [
        "gpu02:4410:4410 [6] include/alloc.h:124 NCCL WARN Cuda failure 2 'out of memory'",
        "gpu02:4410:4410 [6] NCCL INFO include/alloc.h:246 -> 1",
        "[rank14]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5",
        "[rank14]: ncclUnhandledCudaError: Call to CUDA function failed.",
        "[rank14]: Last error:",
        "[rank14]: Cuda failure 'out of memory'",
    ], category="oom_gpu", culprit=None, transient=False, expected_action="stop_job", nodelist="gpu[01-02]", tasks_per_node=8)
    write("030-oom-host-slurm-cgroup.log", megatron(900, 15) + [
        "slurmstepd: error: Detected 1 oom_kill event in StepId=551410.0. Some of the step tasks have been OOM Killed.",
        "srun: error: gpu03: task 17: Out Of Memory",
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
    ], category="oom_host", culprit=None, transient=False, expected_action="stop_job")
    write("031-oom-host-kernel", {
        "train.log": hf_trainer(5, 8) + elastic_summary("gpu02", 3, 3, -9, "SIGKILL"),
        "kern.log": ["Mar 12 10:14:02 gpu02 kernel: pt_main_thread invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0",
                     "Mar 12 10:14:02 gpu02 kernel: Out of memory: Killed process 901211 (pt_main_thread) total-vm:912345678kB, anon-rss:498765432kB, file-rss:0kB, shmem-rss:1024kB, UID:1201 pgtables:9876kB oom_score_adj:0"],
    }, category="oom_host", culprit=None, transient=False, expected_action="stop_job")
    write("032-oom-host-cpu-allocator.log", [
        "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)",
    ], category="oom_host", culprit=None, transient=False, expected_action="stop_job")

    # ---- data loader ------------------------------------------------------------------
    write("033-dataloader-shm-bus-error.log", hf_trainer(40, 10) + [
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
        "RuntimeError: DataLoader worker (pid 7781) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.",
    ], category="data_loader", culprit=None, transient=None, expected_action="restart")
    write("034-dataloader-exited.log", megatron(5, 4) + [
        "[rank2]: RuntimeError: DataLoader worker (pid(s) 9012, 9013) exited unexpectedly",
    ], category="data_loader", culprit=None, transient=True, expected_action="restart")
    write("035-dataloader-timeout.log", [
        "Epoch 3:  41%|####      | 820/2000 [12:01<17:18,  1.14it/s, loss=0.412, v_num=7]",
        "RuntimeError: DataLoader timed out after 1800 seconds",
    ], category="data_loader", culprit=None, transient=True, expected_action="restart")
    write("036-dataloader-worker-killed.log", hf_trainer(1, 4) + [
        "RuntimeError: DataLoader worker (pid 55123) is killed by signal: Killed. ",
    ], category="data_loader", culprit=None, transient=True, expected_action="restart")

    # ---- storage / checkpoint ---------------------------------------------------------
    write("037-no-space-ckpt.log", megatron(9990, 10) + [
        " saving checkpoint at iteration   10000 to /lustre/ckpt/run7",
        "OSError: [Errno 28] No space left on device: '/lustre/ckpt/run7/iter_0010000/mp_rank_00/model_optim_rng.pt'",
    ], category="storage_io", culprit=None, transient=False, expected_action="stop_job")
    write("038-quota.log", ["OSError: [Errno 122] Disk quota exceeded: '/home/alice/.cache/huggingface/datasets/tmp9x1'"], category="storage_io", culprit=None, transient=False, expected_action="stop_job")
    write("039-io-error-lustre", {
        "out.log": megatron(100, 5) + ["[rank20]: OSError: [Errno 5] Input/output error: '/datasets/c4/en/c4-train.00412-of-01024.json.gz'"],
        "kern-gpu03.log": ["Mar 12 10:11:01 gpu03 kernel: LustreError: 11-0: scratch-OST0012-osc-ffff9a1b2c3d: operation ost_read to node 10.20.0.5@o2ib failed: rc = -107",
                           "Mar 12 10:11:02 gpu03 kernel: Lustre: scratch-OST0012-osc-ffff9a1b2c3d: Connection to scratch-OST0012 (at 10.20.0.5@o2ib) was lost; in progress operations using this service will wait for recovery to complete"],
    }, category="storage_io", culprit="gpu03", transient=True, expected_action="restart_excluding_node", nodelist=NODES4, tasks_per_node=8)
    write("040-stale-handle.log", ["OSError: [Errno 116] Stale file handle: '/shared/tokenizer/merges.txt'"], category="storage_io", culprit=None, transient=True, expected_action="restart_excluding_node")
    write("041-ckpt-corrupt-zip.log", [
        " loading checkpoint from /ckpt/run3 at iteration 42000",
        "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
    ], category="checkpoint", culprit=None, transient=False, expected_action="escalate_to_human")
    write("042-ckpt-safetensors.log", ["safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer"], category="checkpoint", culprit=None, transient=False, expected_action="escalate_to_human")
    write("043-ckpt-save-failed.log", megatron(4990, 10) + [
        "RuntimeError: [enforce fail at inline_container.cc:595] . unexpected pos 4402101248 vs 4402101136",
    ], category="checkpoint", culprit=None, transient=True, expected_action="restart")
    write("044-ckpt-unpickle.log", ["_pickle.UnpicklingError: invalid load key, '\\x00'."], category="checkpoint", culprit=None, transient=False, expected_action="escalate_to_human")

    # ---- user code ------------------------------------------------------------------
    for n, (exc, culprit, prefix) in enumerate([
        ("KeyError: 'attention_mask'", None, ""),
        ("ValueError: Input sequence length 8192 exceeds max_position_embeddings 4096", None, ""),
        ("ModuleNotFoundError: No module named 'flash_attn'", None, "[default0]:"),
        ("TypeError: forward() got an unexpected keyword argument 'position_ids'", "rank 7", "[rank7]: "),
        ("ZeroDivisionError: division by zero", None, ""),
    ]):
        body = hf_trainer(300, 6) + [f"{prefix}Traceback (most recent call last):", f'{prefix}  File "/workspace/train.py", line {100 + n}, in <module>', f"{prefix}{exc}"]
        write(f"{45 + n:03d}-user-{exc.split(':')[0].lower()}.log", body, category="user_code", culprit=culprit, transient=False, expected_action="stop_job")
    write("050-nan-grad-norm.log", megatron(20000, 5) + [
        "AssertionError: Rank 12: found NaN in local grad norm in backward pass before data-parallel communication collective. Device: 4, node: gpu02",
    ], category="user_code", culprit=None, transient=None, expected_action="escalate_to_human")

    # ---- Slurm scheduler ------------------------------------------------------------
    write("051-time-limit.log", megatron(77000, 20) + slurm_tail(551289, "gpu01", "TIME LIMIT"), category="scheduler_preemption", culprit=None, transient=True, expected_action="wait")
    write("052-preemption.log", hf_trainer(600, 10) + slurm_tail(551290, "gpu05", "PREEMPTION"), category="scheduler_preemption", culprit=None, transient=True, expected_action="wait")
    write("053-requeue.log", megatron(10, 3) + ["slurmstepd: error: *** JOB 771 ON gpu01 CANCELLED AT 2025-03-13T02:15:40 DUE TO JOB REQUEUE ***"], category="scheduler_preemption", culprit=None, transient=True, expected_action="wait")
    write("054-node-failure-srun.log", megatron(100, 10) + [
        "srun: error: Node failure on gpu04",
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
    ] + slurm_tail(551300, "gpu01", "NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS"), category="node_down", culprit="gpu04", transient=False, expected_action="drain_node_and_restart", nodelist=NODES4, tasks_per_node=8)
    write("055-scancel.log", megatron(100, 8) + slurm_tail(551301, "gpu01") + ["srun: forcing job termination"], category="scheduler_preemption", culprit=None, transient=None, expected_action="wait")
    # Slurm state only (empty-ish log)
    write("056-state-node-down.log", ["starting run 551302", "loading data"], category="node_down", culprit="gpu02", transient=False, expected_action="drain_node_and_restart",
          nodelist=NODES4, tasks_per_node=8, slurm={"job_state": "NODE_FAIL", "state_reason": "NodeDown", "node_states": {"gpu01": "ALLOCATED", "gpu02": "DOWN*", "gpu03": "ALLOCATED", "gpu04": "MIXED"}, "node_reasons": {"gpu02": "Not responding"}})
    write("057-state-oom.log", ["epoch 1 step 200 loss 0.88"], category="oom_host", culprit=None, transient=False, expected_action="stop_job", slurm={"job_state": "OUT_OF_MEMORY", "state_reason": "OutOfMemory", "exit_code": 0, "signal": 9})
    write("058-state-timeout.log", ["epoch 9 step 91000 loss 0.41"], category="scheduler_preemption", culprit=None, transient=True, expected_action="wait", slurm={"job_state": "TIMEOUT", "state_reason": "TimeLimit"})
    write("059-state-preempted.log", ["step 5"], category="scheduler_preemption", culprit=None, transient=True, expected_action="wait", slurm={"job_state": "PREEMPTED"})
    write("060-state-failed-no-evidence.log", ["step 5", "step 6"], category="unknown", culprit=None, transient=None, expected_action="escalate_to_human", slurm={"job_state": "FAILED", "state_reason": "NonZeroExitCode", "exit_code": 1})

    # ---- tricky negatives / thin evidence ----------------------------------------------
    write("061-benign-error-words.log", megatron(10, 30) + [
        "validation error rate: 0.0123 | mean absolute error: 0.441",
        "[rank0]: WARNING: Error reporting is disabled for rank 0; set TRAINMEDIC_DEBUG to enable",
        "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py:4160: UserWarning: No device id is provided via `init_process_group` or `barrier `. Using the current device set by the user.",
        "[W init.cpp:767] Warning: nvfuser is no longer supported in torch script, use _jit_set_nvfuser_enabled is deprecated and a no-op (function operator())",
        "NCCL_DEBUG=WARN is set; you can set NCCL_DEBUG=INFO for details",
    ], category="unknown", culprit=None, transient=None, expected_action="escalate_to_human")
    write("062-killed-only.log", megatron(10, 10) + ["/var/spool/slurmd/job9/slurm_script: line 20: 4410 Killed                  python train.py"], category="unknown", culprit=None, transient=None, expected_action="escalate_to_human")
    write("063-benign-warnings-then-xid-on-other-node.log", [
        "[rank0]:[W ProcessGroupNCCL.cpp:4115] [PG 0 Rank 0]  using GPU 0 to perform barrier as devices used by this process are currently unknown. This can potentially cause a hang if this rank to GPU mapping is incorrect.",
        "[rank0]:[W reducer.cpp:1400] Warning: find_unused_parameters=True was specified in DDP constructor, but did not find any unused parameters in the forward pass.",
        "Mar 12 10:19:30 gpu01 kernel: NVRM: Xid (PCI:0000:18:00): 92, pid=0, name=none, High single-bit ECC error rate",
        "Mar 12 10:20:02 gpu04 kernel: NVRM: Xid (PCI:0000:ba:00): 64, pid=9911, name=python, Row Remapper Error: Failed to remap row",
    ] + watchdog(2, 300), category="gpu_memory_ecc", culprit="gpu04", transient=False, expected_action="drain_node_and_restart", nodelist=NODES4, tasks_per_node=8)
    # A benign "error" in output then a real user bug
    write("064-benign-then-assert.log", ["eval: top-1 error 23.1% (best 22.9%)"] + hf_trainer(1, 5) + [
        "AssertionError: micro batch size (3) times data parallel size (16) must divide global batch size (1000)",
    ], category="user_code", culprit=None, transient=False, expected_action="stop_job")

    (HERE / "labels.jsonl").write_text("".join(json.dumps(label) + "\n" for label in labels))
    print(f"wrote {len(labels)} cases")


if __name__ == "__main__":
    main()
