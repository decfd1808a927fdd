"""PyTorch per-op selective activation checkpointing (`--recompute op`): torchtitan's `selective` mode with
`selective_ac_option = "op"` (torchtitan/models/llama3/parallelize_llama.py, `_save_list` and
`_custom_policy`, read at commit e7c0cae of June 2025).

Each transformer block runs under `torch.utils.checkpoint` with a policy that decides op by op what the
backward finds saved: the outputs of matrix multiplies (`aten.mm`), of flash / memory-efficient attention,
of reduce-scatters and of `max` (FP8 scaling's amax) are saved -- and, in later torchtitan, of all-to-alls
(torchtitan/distributed/activation_checkpoint.py) -- except every second `aten.mm` of the block (counted in
forward order); every other op (norms, RoPE, activations, residual adds, and the grouped `_grouped_mm` of
routed experts, which is not on the list) is recomputed before the block's backward. So a block saves its
input, the odd-numbered matmul outputs, the attention output and a MoE block's all-to-all outputs, and
recomputes the even-numbered matmuls, the routed experts and the cheap ops between them.

The matmuls are counted as PyTorch / Hugging Face modules write them: separate q, k, v and output
projections (MLA: q_a / q_b or q, kv_a, kv_b, output), then the MLP's gate, up and down projections (w1, w3,
w2 in torchtitan's order) or fc1 / fc2; a MoE block's router and shared experts are matmuls, its routed
experts grouped GEMMs.
"""
from __future__ import annotations

from dataclasses import dataclass

from estimators.model_config import ModelConfig


@dataclass(frozen=True)
class BlockMatmul:
    """One `aten.mm` of a transformer block's forward: y[T, out] = x[T, inp] @ W (unsharded widths)."""

    name: str
    out: int
    inp: int
    tp_split: str      # which width tensor parallelism divides: "out" (column-parallel) or "inp" (row-parallel)
    min_out: int = 0   # the least a rank holds of the output: K / V keep one whole head when tp > KV heads


def block_matmuls(model: ModelConfig, layer: int) -> list[BlockMatmul]:
    """The matmuls of one block's forward in the order they run (routed experts excluded: grouped GEMMs)."""
    h = model.hidden
    out: list[BlockMatmul] = []
    if model.mla:
        a = model.mla
        q_width = model.heads * (a.qk_nope_head_dim + a.qk_rope_head_dim)
        if a.q_lora_rank:
            out += [BlockMatmul("q_a_proj", a.q_lora_rank, h, "none"),
                    BlockMatmul("q_b_proj", q_width, a.q_lora_rank, "out")]
        else:
            out.append(BlockMatmul("q_proj", q_width, h, "out"))
        out += [BlockMatmul("kv_a_proj", a.kv_lora_rank + a.qk_rope_head_dim, h, "none"),
                BlockMatmul("kv_b_proj", model.heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, "out"),
                BlockMatmul("o_proj", h, model.heads * a.v_head_dim, "inp")]
    else:
        d = model.d_head
        out += [BlockMatmul("q_proj", model.q_dim, h, "out"), BlockMatmul("k_proj", model.kv_dim, h, "out", d),
                BlockMatmul("v_proj", model.kv_dim, h, "out", d), BlockMatmul("o_proj", h, model.q_dim, "inp")]
    if model.is_moe_layer(layer):
        mo = model.moe
        out.append(BlockMatmul("router", mo.num_experts, h, "none"))
        fs = getattr(mo, "shared_ffn", mo.expert_ffn) * mo.shared_experts
        if fs:
            out += _mlp("shared_expert_", model, fs)
    else:
        out += _mlp("mlp_", model, model.ffn)
    return out


def _mlp(prefix: str, model: ModelConfig, f: int) -> list[BlockMatmul]:
    h = model.hidden
    if model.gated:
        return [BlockMatmul(prefix + "gate_proj", f, h, "out"), BlockMatmul(prefix + "up_proj", f, h, "out"),
                BlockMatmul(prefix + "down_proj", h, f, "inp")]
    return [BlockMatmul(prefix + "fc1", f, h, "out"), BlockMatmul(prefix + "fc2", h, f, "inp")]


def recomputed_matmuls(model: ModelConfig, layer: int) -> list[BlockMatmul]:
    """Every second matmul of the block (the 2nd, 4th, ...): recomputed before its backward."""
    return block_matmuls(model, layer)[1::2]


def saved_matmuls(model: ModelConfig, layer: int) -> list[BlockMatmul]:
    """The 1st, 3rd, ... matmuls: their outputs are saved for the backward."""
    return block_matmuls(model, layer)[0::2]


def local_width(mm: BlockMatmul, tp: int) -> float:
    """The output width one tensor-parallel rank holds of a matmul's output."""
    return max(mm.out / tp, mm.min_out) if mm.tp_split == "out" else float(mm.out)
