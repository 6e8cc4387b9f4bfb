"""A small transformer language model on synthetic data, written to the `fab train` contract.

    fab train --script examples/train_lm.py --args "--steps 2000"            # GPUs
    fab train --script examples/train_lm.py --cpu --nproc-per-node 2          # gloo on CPUs

What it shows (README "fab train"):

- torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...) and DDP: NCCL on
  GPUs, gloo on CPUs;
- mixed precision: bf16 autocast where the hardware has it (Ampere and later, and CPUs), fp16
  with a GradScaler on older GPUs (V100, T4), whose state is saved with the model;
- gradient checkpointing of every transformer block (activations recomputed in backward);
- checkpoints in GPUFLEET_CHECKPOINT_DIR: rank 0 writes ``step-<N>/model.pt`` with
  torch.save into a hidden temp folder, then a ``COMPLETE`` file listing the files and their
  sizes, then renames the folder: a stop at any moment leaves either the whole checkpoint or
  none. The step counter, the optimizer and the scaler are restored on a resume; the rest of
  the job (the bucket, the resume after a stop) is gpufleet's;
- a graceful stop: SIGTERM (``fab cancel``, a spot notice) finishes the current step on every
  rank, saves a checkpoint and exits 0.

The data are sequences ``x_t = (a + b * t) mod vocab`` with random ``a, b``: after two tokens
the rest is predictable, so the loss falls within a few dozen steps on a CPU.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

MARKER = "COMPLETE"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ckpt-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--dtype", choices=["auto", "bf16", "fp16", "fp32"], default="auto")
    p.add_argument("--no-grad-checkpointing", action="store_true")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (tests)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int, ckpt: bool):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.grad_checkpointing = ckpt

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos[:t]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), diagonal=1)
        for block in self.blocks:
            if self.grad_checkpointing and self.training:
                x = checkpoint(block, x, mask, use_reentrant=False)
            else:
                x = block(x, mask)
        return self.head(self.ln(x))


def synthetic_batch(
    step: int, rank: int, args: argparse.Namespace, device: torch.device
) -> torch.Tensor:
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 4099 + rank)
    a = torch.randint(0, args.vocab, (args.batch, 1), generator=g)
    b = torch.randint(1, args.vocab, (args.batch, 1), generator=g)
    t = torch.arange(args.seq + 1).unsqueeze(0)
    return ((a + b * t) % args.vocab).to(device)


def pick_dtype(choice: str, device: torch.device) -> torch.dtype | None:
    """None: fp32. bf16 needs no loss scaling; fp16 does (see the GradScaler below)."""
    if choice == "fp32":
        return None
    if choice == "bf16":
        return torch.bfloat16
    if choice == "fp16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16  # CPU autocast supports bf16


# ---------------------------------------------------------------------------- checkpoints


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint whose COMPLETE file agrees with the files, newest
    first: the same rule gpufleet uses in the bucket."""
    found = []
    for folder in root.glob("step-*") if root.is_dir() else []:
        try:
            step = int(folder.name.split("-", 1)[1])
            files = json.loads((folder / MARKER).read_text())["files"]
            if all((folder / n).stat().st_size == size for n, size in files.items()):
                found.append((step, folder))
        except (ValueError, OSError, KeyError, TypeError):
            continue
    return sorted(found, reverse=True)


def save_checkpoint(root: Path, step: int, state: dict[str, Any]) -> Path:
    """Write-then-rename: the folder appears only once everything in it is on disk."""
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    tmp.mkdir(parents=True, exist_ok=True)
    with open(tmp / "model.pt", "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    marker = {"step": step, "files": {"model.pt": (tmp / "model.pt").stat().st_size}}
    with open(tmp / MARKER, "w") as f:
        json.dump(marker, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def broadcast_bytes(blob: bytes, rank: int, device: torch.device) -> bytes:
    """Rank 0's bytes on every rank, through two broadcasts (no pickling, no NumPy)."""
    size = torch.tensor([len(blob)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    if rank == 0:
        data = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device) if blob else None
    else:
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if int(size.item()) == 0:
        return b""
    assert data is not None
    dist.broadcast(data, src=0)
    return blob if rank == 0 else bytes(data.cpu().tolist())


def restore(
    ckpt_dir: Path, rank: int, device: torch.device, distributed: bool, parts: tuple[Any, ...]
) -> int:
    """The step to start from, with ``parts`` (model, optimizer, scaler) loaded from the
    newest complete checkpoint. Rank 0 reads it and hands it to every rank, so only the
    head's GPUFLEET_CHECKPOINT_DIR needs to hold it (the other nodes' may be empty)."""
    blob = b""
    if rank == 0:
        found = complete_checkpoints(ckpt_dir)
        if found:
            blob = (found[0][1] / "model.pt").read_bytes()
    if distributed:
        blob = broadcast_bytes(blob, rank, device)
    if not blob:
        return 0
    ckpt = torch.load(io.BytesIO(blob), map_location="cpu")
    model, opt, scaler = parts
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    scaler.load_state_dict(ckpt["scaler"])
    start = int(ckpt["step"])
    print(f"resumed from step {start}", flush=True)
    return start


def training_state(
    model: nn.Module, opt: Any, scaler: Any, step: int, args: argparse.Namespace
) -> dict[str, Any]:
    """What a checkpoint holds: enough to go on from ``step`` exactly."""
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scaler": scaler.state_dict(),
        "step": step,
        "args": vars(args),
    }


# ---------------------------------------------------------------------------- training


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    distributed = "MASTER_ADDR" in os.environ
    if distributed:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    ckpt_dir = Path(os.environ.get("GPUFLEET_CHECKPOINT_DIR", "checkpoints"))
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)

    stop = {"asked": False}

    def on_term(signum: int, frame: object) -> None:
        del signum, frame
        stop["asked"] = True

    signal.signal(signal.SIGTERM, on_term)

    torch.manual_seed(args.seed)
    model = TinyLM(
        args.vocab, args.dim, args.layers, args.heads, args.seq, not args.no_grad_checkpointing
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    dtype = pick_dtype(args.dtype, device)
    # Loss scaling only matters for fp16 on a GPU: bf16 keeps fp32's exponent range.
    scaler = torch.amp.GradScaler("cuda", enabled=use_cuda and dtype == torch.float16)

    start = restore(ckpt_dir, rank, device, distributed, (model, opt, scaler))
    ddp: nn.Module = DDP(model) if distributed else model

    first_loss = last_loss = math.nan
    tokens = 0
    t0 = time.monotonic()
    step = start
    while step < args.steps:
        batch = synthetic_batch(step, rank, args, device)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = ddp(batch[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        step += 1
        tokens += batch[:, :-1].numel()
        last_loss = loss.item()
        if step == start + 1:
            first_loss = last_loss
            print(f"first step {step} at {time.time():.3f} loss {last_loss:.4f}", flush=True)
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            rate = tokens * world / max(time.monotonic() - t0, 1e-9)
            print(f"step {step} loss {last_loss:.4f} tokens/s {rate:.0f}", flush=True)
        # Every rank agrees on stopping at this step (SIGTERM reaches them at slightly
        # different moments; a rank that left early would hang the others' all-reduce).
        flag = torch.tensor([1.0 if stop["asked"] else 0.0], device=device)
        if distributed:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stopping = bool(flag.item())
        if rank == 0 and (step % args.ckpt_every == 0 or step == args.steps or stopping):
            path = save_checkpoint(ckpt_dir, step, training_state(model, opt, scaler, step, args))
            print(f"checkpoint {path.name}", flush=True)
        if stopping:
            print(f"stopping at step {step} (SIGTERM): checkpoint saved", flush=True)
            break
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if rank == 0:
        summary = {"start_step": start, "end_step": step, "first_loss": first_loss}
        summary["last_loss"] = last_loss
        if use_cuda:
            summary["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        summary["tokens_per_s"] = tokens * world / max(time.monotonic() - t0, 1e-9)
        print("done " + json.dumps(summary), flush=True)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
