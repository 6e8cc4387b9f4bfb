"""How much memory a run needs on each GPU.

Memory per GPU, in GB of 10^9 bytes, from these published figures:
- weights, gradients and optimizer states per parameter as in ZeRO (Rajbhandari et al. 2020,
  section 3.1): mixed precision keeps 16-bit weights (2 B) and gradients (2 B) and, in the
  optimizer, an fp32 master copy (4 B) plus the optimizer's own states. AdamW: momentum and
  variance in fp32 (4 + 4 B), so 2 + 2 + 12 = 16 B per parameter. fp32 training has no master
  copy: 4 + 4 + 8. AdamW 8-bit (Dettmers et al. 2022): momentum and variance in 1 B each.
  Adafactor (Shazeer and Stern 2018), no momentum: only row and column sums of the second
  moment, O(rows + cols) per matrix. SGD: one fp32 momentum buffer (4 B), none without momentum.
  (PyTorch's autocast keeps fp32 weights and gradients and makes 16-bit copies on the fly: the
  same 16 B per parameter for AdamW, split differently.)
- activations of a transformer layer (Korthikanti et al. 2022, section 4.1): s*b*h*(34 + 5*a*s/h)
  bytes without recomputation, 16-bit activations and 1-byte dropout masks; the 5*a*s/h term is
  the stored attention scores, which FlashAttention (Dao et al. 2022) and PyTorch's SDPA kernels
  never store, leaving 34*s*b*h. Full activation checkpointing keeps 2*s*b*h per layer (each
  layer's 16-bit input) plus one layer's activations while it is recomputed. The fp32 logits the
  loss keeps add 4*s*b*v bytes. fp32 training doubles the 16-bit terms.
- a CNN row carries its measured bytes per sample; checkpointing sqrt(n) segments (Chen et al.
  2016) keeps about 2/sqrt(n) of them.
- framework overhead per GPU (CUDA context, workspaces, NCCL buffers) and, under fsdp, the full
  16-bit weights of the layers gathered at once: sizing.toml.
ddp replicates weights, gradients and optimizer states on every GPU; fsdp (ZeRO-3-like) shards
all three across every GPU of every node. Activations are per GPU either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from infra.catalog import Gpu
from infra.pricing.workload import Assumptions, Workload, load_assumptions

GB = 1e9


@dataclass(frozen=True)
class BytesPerParam:
    weights: float
    gradients: float
    optimizer: float  # fp32 master copy (mixed precision) + the optimizer's states
    master: float
    note: str

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


_OPTIMIZER_STATE = {  # bytes per parameter of the optimizer's own states (fp32 unless 8-bit)
    "adamw": (8.0, "AdamW momentum + variance in fp32 (4 + 4 B)"),
    "adamw-8bit": (2.0, "8-bit AdamW: momentum + variance in 1 B each (Dettmers et al. 2022)"),
    "adafactor": (0.0, "Adafactor: factored second moment, rows + columns per matrix"),
    "sgd": (4.0, "SGD momentum buffer in fp32 (4 B)"),
}


def bytes_per_param(precision: str, optimizer: str, momentum: bool = True) -> BytesPerParam:
    mixed = precision != "fp32"
    w = 2.0 if mixed else 4.0
    master = 4.0 if mixed else 0.0
    state, note = _OPTIMIZER_STATE[optimizer]
    if optimizer == "sgd" and not momentum:
        state, note = 0.0, "SGD without momentum keeps no state"
    if mixed:
        note = f"16-bit weights and gradients, fp32 master copy (4 B); {note}"
    return BytesPerParam(w, w, master + state, master, note)


@dataclass(frozen=True)
class Memory:
    """Per-GPU memory before sharding, GB. `activations_gb` is None when no shape was given."""

    weights_gb: float
    gradients_gb: float
    optimizer_gb: float
    activations_gb: float | None
    overhead_gb: float
    per_param: BytesPerParam
    activation_formula: str
    gathered_layer_gb: float  # 16-bit weights of one layer (fsdp gathers some at once)

    @property
    def states_gb(self) -> float:
        return self.weights_gb + self.gradients_gb + self.optimizer_gb

    def per_gpu(self, strategy: str, gpus: int, gathered_layers: int) -> float:
        act = self.activations_gb or 0.0
        if strategy == "fsdp" and gpus > 1:
            gathered = min(gathered_layers * self.gathered_layer_gb, self.weights_gb)
            return self.states_gb / gpus + gathered + act + self.overhead_gb
        return self.states_gb + act + self.overhead_gb

    def to_json(self) -> dict[str, Any]:
        return {
            "weights_gb": round(self.weights_gb, 2),
            "gradients_gb": round(self.gradients_gb, 2),
            "optimizer_gb": round(self.optimizer_gb, 2),
            "activations_gb": None
            if self.activations_gb is None
            else round(self.activations_gb, 2),
            "overhead_gb": round(self.overhead_gb, 2),
            "bytes_per_param": {
                "weights": self.per_param.weights,
                "gradients": self.per_param.gradients,
                "optimizer": self.per_param.optimizer,
                "master_copy": self.per_param.master,
                "note": self.per_param.note,
            },
            "activation_formula": self.activation_formula,
        }


def activation_bytes(w: Workload) -> tuple[float | None, str]:
    """Activation bytes one GPU keeps for one micro-batch, and how they were computed."""
    if not w.has_shape:
        return None, "not counted: give the model's shape (--layers --hidden --seq-len) or --model"
    b = w.micro_batch
    if w.kind == "cnn":
        assert w.activation_bytes_per_sample is not None and w.layers is not None
        per = w.activation_bytes_per_sample * b
        if w.grad_checkpointing:
            keep = min(1.0, 2 / math.sqrt(w.layers))
            return per * keep, (
                f"measured {w.activation_bytes_per_sample / 1e6:.1f} MB per sample x {b}, "
                f"x 2/sqrt({w.layers}) kept with checkpointing (Chen et al. 2016)"
            )
        return per, f"measured {w.activation_bytes_per_sample / 1e6:.1f} MB per sample x {b}"
    assert w.layers is not None and w.hidden is not None and w.seq_len is not None
    s, h, L = w.seq_len, w.hidden, w.layers
    a = w.heads or max(1, h // 128)
    scores = 5 * a * s / h if w.attention == "eager" else 0.0
    layer = s * b * h * (34 + scores)
    k = 1.0 if w.mixed else 2.0  # the formula counts 16-bit activations
    logits = 4.0 * s * b * (w.vocab or 0)
    term = (
        f"s*b*h*(34 + 5*a*s/h) = {s}*{b}*{h}*(34 + {scores:.1f})"
        if scores
        else (f"s*b*h*34 = {s}*{b}*{h}*34 (flash attention: no stored scores)")
    )
    if w.grad_checkpointing:
        total = k * (2 * s * b * h * L + layer) + logits
        how = f"checkpointing: 2*s*b*h x {L} layers + one layer recomputed ({term})"
    else:
        total = k * layer * L + logits
        how = f"{term} per layer x {L} layers"
    if logits:
        how += f" + 4*s*b*v fp32 logits (v={w.vocab})"
    if not w.mixed:
        how += "; x2 for fp32"
    return total, how + " (Korthikanti et al. 2022)"


def memory_breakdown(w: Workload, assumptions: Assumptions | None = None) -> Memory:
    a = assumptions or load_assumptions()
    per = bytes_per_param(w.precision, w.optimizer, w.momentum)
    optimizer_bytes = per.optimizer * w.params
    if w.optimizer == "adafactor" and w.kind == "transformer" and w.has_shape:
        # row + column sums of each matrix: qkv (h+3h), proj (2h), fc1 (5h), fc2 (5h) per layer,
        # and the embedding (v + h), in fp32
        assert w.layers is not None and w.hidden is not None
        optimizer_bytes += 4.0 * (16 * w.hidden * w.layers + (w.vocab or 0) + w.hidden)
    act, formula = activation_bytes(w)
    layers = w.layers or 1
    return Memory(
        weights_gb=per.weights * w.params / GB,
        gradients_gb=per.gradients * w.params / GB,
        optimizer_gb=optimizer_bytes / GB,
        activations_gb=None if act is None else act / GB,
        overhead_gb=a.overhead_gb,
        per_param=per,
        activation_formula=formula,
        gathered_layer_gb=per.weights * w.params / layers / GB,
    )


def usable_gb(gpu: Gpu, assumptions: Assumptions) -> float:
    return gpu.memory_gb * (1 - assumptions.headroom)
