"""The measurements that need torch, one process per GPU, launched by torchrun.

Copied to the node and run there by verify_node.py (stdlib + torch only, nothing from the
project). Every rank measures its own GPU at the same time as the others (GEMM throughput,
HBM copy bandwidth), so the node is under full load while verify_node.py samples nvidia-smi;
then all ranks run the collective checks together: an all-reduce bus-bandwidth test and a small
transformer trained with DDP, mixed precision and gradient checkpointing. Each rank writes
``rank<N>.json`` into --outdir; verify_node.py merges them.

On CPU (gloo) the same code path runs with a tiny model, so CI exercises the real thing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

MiB = 1 << 20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Seconds per call of fn, averaged over iters, with the device drained before and after."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / iters


def _calibrated(
    fn: Callable[[], object], device: torch.device, seconds: float
) -> tuple[float, int]:
    """Warm up, estimate one call, then time enough calls to fill about ``seconds``."""
    _timed(fn, device, 2)
    estimate = _timed(fn, device, 3)
    iters = max(5, min(10_000, int(seconds / max(estimate, 1e-6))))
    return _timed(fn, device, iters), iters


def measure_gemm(device: torch.device, dtype: torch.dtype, seconds: float) -> dict[str, Any]:
    """Dense square matmul throughput. 8192^3 keeps tensor cores saturated on every tier we
    rent (it is the size behind the ~80 % of peak figures for H100/H200); smaller cards get a
    smaller matrix so three of them fit comfortably."""
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 1 << 34
    n = 8192
    while 3 * n * n * dtype.itemsize > free / 4 and n > 1024:
        n //= 2
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    per_call, iters = _calibrated(lambda: torch.matmul(a, b, out=out), device, seconds)
    finite = bool(torch.isfinite(out).all())
    return {
        "n": n,
        "dtype": str(dtype).removeprefix("torch."),
        "iters": iters,
        "seconds_per_call": per_call,
        "tflops": 2 * n**3 / per_call / 1e12,
        "finite": finite,
    }


def measure_hbm(device: torch.device, seconds: float) -> dict[str, Any]:
    """Device-to-device copy bandwidth (bytes read + bytes written, like the STREAM copy).

    Buffers of 2 GiB (or an eighth of free memory) are far beyond every L2 cache."""
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 1 << 31
    nbytes = min(2 << 30, free // 8)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    per_call, iters = _calibrated(lambda: dst.copy_(src), device, seconds)
    return {"bytes": nbytes, "iters": iters, "gbs": 2 * nbytes / per_call / 1e9}


def measure_allreduce(device: torch.device, nbytes: int, iters: int) -> dict[str, Any]:
    """Correctness of a sum all-reduce, then bus bandwidth as nccl-tests defines it:
    algbw = bytes / time, busbw = algbw * 2 (n - 1) / n."""
    world, rank = dist.get_world_size(), dist.get_rank()
    probe = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(probe)
    want = world * (world + 1) / 2
    correct = bool(torch.all(probe == want))
    numel = nbytes // 4
    buf = torch.ones(numel, dtype=torch.float32, device=device)
    per_call = _timed(lambda: dist.all_reduce(buf), device, 2)  # warm-up: NCCL builds rings
    per_call = _timed(lambda: dist.all_reduce(buf), device, iters)
    # The slowest rank defines the collective's time.
    slowest = torch.tensor([per_call], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    per_call = float(slowest.item())
    algbw = numel * 4 / per_call / 1e9
    return {
        "world": world,
        "bytes": numel * 4,
        "iters": iters,
        "seconds_per_call": per_call,
        "correct": correct,
        "algbw_gbs": algbw,
        "busbw_gbs": algbw * 2 * (world - 1) / world if world > 1 else 0.0,
    }


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention (SDPA, flash kernels on GPU) + MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        # GPT-2's small-normal init: the default N(0, 1) embedding, tied to the output layer,
        # would start the loss far above ln(vocab).
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            # Gradient checkpointing: the verification step must exercise the same
            # recompute path that real memory-bound training runs use.
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(self.ln(x))


# Model sizes: big enough on GPU to keep tensor cores busy (~110M parameters), tiny on CPU so
# CI trains two gloo processes in a few seconds.
SIZES = {
    "gpu": {"vocab": 1024, "dim": 1024, "layers": 8, "heads": 16, "seq": 1024, "batch": 8},
    "cpu": {"vocab": 128, "dim": 64, "layers": 2, "heads": 4, "seq": 64, "batch": 8},
}


def walk_table(vocab: int, seq: int, device: torch.device) -> torch.Tensor:
    """Row v: the walk v, perm[v], perm[perm[v]], ... of a fixed random permutation.

    Training rows are walks from random starts, so token t is always followed by perm[t]: a
    bigram table a working model learns within a few dozen steps (its loss falls fast), while
    a broken step (NaNs, a dead all-reduce, a wrong scaler) shows up as a flat or exploding
    curve. The same table on every rank (seed 0), built once so the GPU never waits on it."""
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))
    table = torch.empty(vocab, seq + 1, dtype=torch.long)
    table[:, 0] = torch.arange(vocab)
    for t in range(seq):
        table[:, t + 1] = perm[table[:, t]]
    return table.to(device)


def train(
    device: torch.device,
    size: dict[str, int],
    dtype: torch.dtype,
    steps: int,
    warmup: int,
    lr: float,
) -> dict[str, Any]:
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)  # the same initial weights everywhere; DDP also broadcasts them
    model = TinyGPT(size["vocab"], size["dim"], size["layers"], size["heads"], size["seq"])
    model = model.to(device)
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    opt = torch.optim.AdamW(ddp.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    # fp16 has too little range for raw gradients; bf16 does not need a scaler (T4/V100 lack it).
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    table = walk_table(size["vocab"], size["seq"], device)
    gen = torch.Generator().manual_seed(1000 + rank)  # different walks on every rank
    batch, seq, vocab = size["batch"], size["seq"], size["vocab"]
    losses: list[torch.Tensor] = []
    started = 0.0
    for step in range(steps):
        if step == warmup:
            _sync(device)
            started = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / max(1, warmup))
        data = table[torch.randint(0, vocab, (batch,), generator=gen).to(device)]
        with torch.autocast(device_type=device.type, dtype=dtype):
            logits = ddp(data[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), data[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.detach())
    _sync(device)
    elapsed = time.perf_counter() - started
    # Average the curve over ranks: every rank saw different data.
    curve = torch.stack(losses).float()
    dist.all_reduce(curve)
    curve /= world
    params = sum(p.numel() for p in model.parameters())
    counted = params - model.pos.weight.numel()
    # Model FLOPs per token: 6N for the dense weights plus the attention score/value matmuls
    # (PaLM, Chowdhery et al. 2022, appendix B; nanoGPT's estimate_mfu). Recompute from
    # checkpointing is not counted: MFU measures useful work, not work done.
    flops_per_token = 6 * counted + 12 * size["layers"] * size["dim"] * seq
    timed_steps = steps - warmup
    tokens = batch * seq * world * timed_steps
    return {
        "world": world,
        "backend": dist.get_backend(),
        "dtype": str(dtype).removeprefix("torch."),
        "amp": "fp16+GradScaler" if dtype == torch.float16 else "bf16-autocast",
        "checkpointing": True,
        "model": dict(size),
        "params": params,
        "flops_per_token": flops_per_token,
        "steps": steps,
        "warmup_steps": warmup,
        "losses": [round(float(x), 5) for x in curve],
        "timed_seconds": elapsed,
        "tokens_per_s": tokens / elapsed if elapsed > 0 else None,
        "scaler_scale": float(scaler.get_scale()) if scaler.is_enabled() else None,
    }


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cpu":
            return torch.bfloat16
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # a build without NCCL: the all-reduce will say more
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def runtime_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            name=props.name,
            memory_bytes=props.total_memory,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            bf16_supported=torch.cuda.is_bf16_supported(),
            nccl=_nccl_version(),
            cudnn=torch.backends.cudnn.version(),
        )
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--outdir", required=True)
    parser.add_argument("--phases", default="gemm,hbm,allreduce,train")
    parser.add_argument("--mode", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--dtype", choices=("auto", "bfloat16", "float16"), default="auto")
    parser.add_argument("--bench-seconds", type=float, default=1.5)
    parser.add_argument("--allreduce-mib", type=int, default=0, help="0: 512 on GPU, 4 on CPU")
    parser.add_argument("--allreduce-iters", type=int, default=0, help="0: 10 on GPU, 5 on CPU")
    parser.add_argument("--steps", type=int, default=0, help="0: 30 on GPU, 40 on CPU")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.0, help="0: 1e-3 on GPU, 3e-3 on CPU")
    parser.add_argument("--tag", default="local", help="names the output file (local | cross)")
    args = parser.parse_args(argv)

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    gpu = args.mode == "gpu"
    out: dict[str, Any] = {
        "rank": rank,
        "local_rank": local_rank,
        "world": int(os.environ.get("WORLD_SIZE", "1")),
        "errors": [],
    }
    out_path = Path(args.outdir) / f"{args.tag}-rank{rank}.json"
    try:
        if gpu:
            if not torch.cuda.is_available():
                raise RuntimeError("torch sees no CUDA device (torch.cuda.is_available() is False)")
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
            # Compare tensor-core throughput with the datasheet, not TF32 shortcuts in fp32 ops.
            torch.backends.cuda.matmul.allow_tf32 = False
        else:
            device = torch.device("cpu")
        dist.init_process_group("nccl" if gpu else "gloo", device_id=device if gpu else None)
        dtype = resolve_dtype(args.dtype, device)
        out["runtime"] = runtime_info(device)
        phases = [p for p in args.phases.split(",") if p]
        if gpu and "gemm" in phases:
            out["gemm"] = measure_gemm(device, dtype, args.bench_seconds)
        if gpu and "hbm" in phases:
            out["hbm"] = measure_hbm(device, args.bench_seconds / 2)
        dist.barrier()
        if "allreduce" in phases and dist.get_world_size() > 1:
            mib = args.allreduce_mib or (512 if gpu else 4)
            iters = args.allreduce_iters or (10 if gpu else 5)
            out["allreduce"] = measure_allreduce(device, mib * MiB, iters)
        if "train" in phases:
            size = SIZES[args.mode]
            steps = args.steps or (30 if gpu else 40)
            lr = args.lr or (1e-3 if gpu else 3e-3)
            out["train"] = train(device, size, dtype, steps, min(args.warmup, steps - 1), lr)
        dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:
        out["errors"].append(f"rank {rank}: {type(exc).__name__}: {exc}")
        out["traceback"] = traceback.format_exc()[-4000:]
    out_path.write_text(json.dumps(out, allow_nan=True))
    # A rank that failed must make torchrun fail too, so the parent stops waiting for the others.
    return 1 if out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
