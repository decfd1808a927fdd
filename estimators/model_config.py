"""Typed model architecture (`ModelConfig`), loaded from TOML (the model zoo in `estimators/zoo/` or a
user file) or a Hugging Face config.json (`estimators.hf_config`), with parameter and FLOP counts derived
from the architecture.

Counting rules (per layer, no biases unless `bias = true`):
- attention, GQA/MHA: q = h*H*d, k = v = h*K*d, o = H*d*h  (H query heads, K kv heads, d head dim)
- attention, MLA (DeepSeek V2/V3): q_a = h*q_lora, q_b = q_lora*H*(nope+rope), kv_a = h*(kv_lora+rope),
  kv_b = kv_lora*H*(nope+v), o = H*v*h, plus the two latent norms
- FFN: gelu / squared_relu = 2*h*f, swiglu = 3*h*f; MoE layer = router h*E + E routed + S shared experts
  (shared expert width `moe.shared_ffn`); attention sinks add H per layer; MTP modules are counted apart
  (`mtp_params`), as the published totals leave them out
- embeddings: vocab*h, doubled when the output projection is untied; learned positions add seq*h.

Model FLOPs per token follow ONE convention, Megatron-Core's (`megatron_flops_per_token`; Megatron-LM
`num_floating_point_operations`, which Megatron-Bridge 25.09+ / NeMo 25.09+ report as "model TFLOP/s"):
2 FLOPs per multiply-add, training = 3 x forward; per token and layer the active matmul weights (attention
projections, dense FFN or top-k routed + shared experts) and attention scores / values against the mean
causal context (seq/2 keys per query: the causal half; sliding-window layers their exact mean), MTP
modules counted, the output projection counted, no embedding lookup, norms, router or biases.
`ModelConfig.model_flops_per_token` is this convention.  NeMo 24.07 (nemo/utils/flops_formulas.py) counts
the attention over the FULL square (12 s h per layer, as Narayanan et al. 2021) and no MTP / windows:
`nemo_2407_flops_per_token`.  The two differ by 1.4-21% on the shared published rows (GPT-3 175B at 2K:
1.4%; Llama 2 7B at 4K: 7%; Llama 3 8B at 8K: 12.5%; Qwen3-30B-A3B at 4K: 21%).  `RELEASE_FLOP_CONVENTION` maps a release to its convention, checked
against every published row that gives both TFLOP/s and tokens/s (tests/test_model_configs.py).
Hardware FLOPs (what the kernels execute: unfused attention computes the full square) are
`full_square_flops_per_token`.
"""
from __future__ import annotations

import os
import re
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from chakra_schema.errors import TraceInputError, check_number, read_toml, reject_unknown_keys, with_path
from estimators.hf_config import hf_model_table, read_hf_json


ZOO_DIR = Path(__file__).resolve().parent / "zoo"

# FFN activations: gated ones (SwiGLU: gate, up, down) have 3 weight matrices, the others 2 (GELU: GPT-3;
# squared ReLU, relu(x)^2: Nemotron-4, So et al. 2021 "Primer").
ACTIVATIONS = ("swiglu", "gelu", "squared_relu")
GATED_ACTIVATIONS = ("swiglu",)
ROUTER_SCORING = ("softmax", "sigmoid")

# Caps that keep a typo (1e20 layers) a one-line error instead of an overflow or an hours-long run.
# MAX_LAYERS: the deepest trained transformers have ~1,000 layers (DeepNet, Wang et al. 2022); the workload
# builds every layer (~1 ms each), so 4,096 layers take seconds.  MAX_DIM: widths and vocabularies past
# 2^31 are beyond any real matrix (as `lumos-sim bench`'s GEMM dimensions).  MAX_EXPERTS: the largest
# published expert count is 1,048,576 (PEER, He 2024, "Mixture of A Million Experts").
MAX_LAYERS = 4096
MAX_DIM = 1 << 31
MAX_EXPERTS = 1 << 20


def _check_count(what: str, value: object, low: int, cap: int | None) -> None:
    """An integer >= `low` (check_number's message) and at most `cap`."""
    check_number(what, value, low, integer=True)
    if cap is not None and value > cap:
        raise TraceInputError(None, f"{what} must be at most {cap:,}, got {value}")


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int                  # routed experts
    top_k: int                        # routed experts per token
    expert_ffn: int                   # hidden size of one routed expert's FFN (HF moe_intermediate_size)
    shared_experts: int = 0           # always-active experts (HF n_shared_experts)
    layer_freq: int = 1               # MoE every `layer_freq` layers (Maverick: 2)
    first_dense_layers: int = 0       # leading dense layers, FFN width `ModelConfig.ffn` (DeepSeek V3: 3)
    # With layer_freq 2, which layers are MoE: layer i (0-based, after the dense prefix) is MoE when
    # i % layer_freq == layer_offset.  Maverick interleaves dense and MoE layers starting with dense.
    layer_offset: int = 0
    # Width of one shared expert when it differs from `expert_ffn` (Qwen2-MoE shared_expert_intermediate_size);
    # 0: same as `expert_ffn` (DeepSeek V3, Kimi K2, Llama 4).  `shared_ffn` gives the effective width.
    shared_expert_ffn: int = 0
    # Node-limited (group-limited) routing: experts are split into `groups` equal groups and a token's
    # top-k experts come from at most `groups_per_token` of them (HF n_group / topk_group; DeepSeek V3:
    # 8 groups, 4 per token, so with EP over 8 nodes a token reaches at most 4 nodes).  1 / 1: unrestricted.
    groups: int = 1
    groups_per_token: int = 1
    router: str = "softmax"           # router scoring: "softmax" (Mixtral, Qwen3) | "sigmoid" (DeepSeek V3)

    def __post_init__(self) -> None:
        for key, low, cap in (("num_experts", 1, MAX_EXPERTS), ("top_k", 1, MAX_EXPERTS), ("groups", 1, MAX_EXPERTS),
                              ("groups_per_token", 1, MAX_EXPERTS), ("expert_ffn", 1, MAX_DIM),
                              ("shared_experts", 0, MAX_EXPERTS), ("shared_expert_ffn", 0, MAX_DIM),
                              ("layer_freq", 1, None), ("first_dense_layers", 0, None), ("layer_offset", 0, None)):
            _check_count(f"'moe.{key}'", getattr(self, key), low, cap)
        if self.top_k > self.num_experts:
            raise TraceInputError(None, "'moe.top_k' must be between 1 and 'moe.num_experts'")
        if self.layer_offset >= self.layer_freq:
            raise TraceInputError(None, "'moe.layer_freq' must be >= 1 and 'moe.layer_offset' < it")
        if self.num_experts % self.groups:
            raise TraceInputError(None, f"'moe.num_experts' ({self.num_experts}) must be a multiple of "
                                        f"'moe.groups' ({self.groups})")
        if self.groups_per_token > self.groups:
            raise TraceInputError(None, "'moe.groups_per_token' must be between 1 and 'moe.groups'")
        if self.top_k > self.groups_per_token * self.experts_per_group:
            raise TraceInputError(None, f"'moe.top_k' ({self.top_k}) exceeds the experts of "
                                        f"'moe.groups_per_token' groups ({self.groups_per_token * self.experts_per_group})")
        if self.router not in ROUTER_SCORING:
            raise TraceInputError(None, f"'moe.router' must be one of {', '.join(ROUTER_SCORING)}, got {self.router!r}")

    @property
    def shared_ffn(self) -> int:
        """FFN width of one shared expert."""
        return self.shared_expert_ffn or self.expert_ffn

    @property
    def experts_per_group(self) -> int:
        return self.num_experts // self.groups


@dataclass(frozen=True)
class MLAConfig:
    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_count(f"'mla.{f.name}'", getattr(self, f.name), 1, MAX_DIM)


@dataclass(frozen=True)
class ModelConfig:
    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int                           # dense FFN hidden size (0 when every layer is MoE)
    vocab: int
    kv_heads: int = 0                  # 0 -> same as heads (MHA)
    head_dim: int = 0                  # 0 -> hidden // heads
    activation: str = "swiglu"         # "swiglu" | "gelu" | "squared_relu" (ACTIVATIONS)
    norm: str = "rmsnorm"              # "rmsnorm" | "layernorm"
    tied_embeddings: bool = False
    position: str = "rope"             # "rope" | "learned"
    max_seq: int = 0                   # learned position table length
    bias: bool = False                 # linear-layer biases (GPT-3)
    display_name: str = ""
    aliases: tuple[str, ...] = ()      # other names published tables use ("Nemotron-340B"); matched like names
    source: str = ""                   # where the architecture facts come from
    published_params_b: float = 0.0    # published total parameters (billions), for checks
    published_active_params_b: float = 0.0
    # Multi-token prediction (DeepSeek V3: 1): extra modules after the last layer, each one transformer
    # layer of the last layer's kind + a 2h -> h projection + 2 norms, sharing the embedding and the output
    # head.  Trained (their forward / backward count in the step) but not part of the published totals.
    mtp_layers: int = 0
    # Sliding-window attention: a windowed layer attends to at most `sliding_window` previous tokens
    # (0: every layer attends to the whole sequence).  `window_pattern` says which layers, cycled over the
    # layers: "S" windowed, "F" full ("SF": GPT-OSS alternates windowed / full starting windowed; "SSSSSF":
    # Gemma 3); a string as long as `layers` lists every layer; empty: every layer windowed (Mistral 7B).
    sliding_window: int = 0
    window_pattern: str = ""
    # Attention sinks (GPT-OSS): one learned logit per head added to the softmax denominator; `heads`
    # parameters per layer, no matmul.
    attention_sinks: bool = False
    # Clamped gated activation (GPT-OSS `swiglu_limit` 7): the gate half is clamped above at this value,
    # the linear half to [-value, value] (0: no clamp).  Megatron-Core clamps the two halves and
    # concatenates them before its fused activation (fused_bias_geglu `weighted_bias_quick_geglu_impl`
    # with `activation_func_clamp_value`): passes over the FFN input the plain activation does not make.
    glu_clamp: float = 0.0
    # YaRN attention temperature (mscale) by which RoPE's cos / sin are scaled: 1 for plain RoPE and for
    # YaRN configs whose mscale and mscale_all_dim cancel (DeepSeek-V3, Kimi K2); 0.1 ln(factor) + 1 otherwise
    # (GPT-OSS: factor 32 -> 1.35). Megatron-Core's fused RoPE kernel (Transformer Engine) takes no mscale, so
    # a value other than 1 runs RoPE as eager PyTorch ops (rope_utils.apply_rotary_pos_emb falls back).
    rope_mscale: float = 1.0
    moe: MoEConfig | None = None
    mla: MLAConfig | None = None

    def __post_init__(self) -> None:
        _validate(self)

    # ------------------------------------------------------------ derived shapes
    @property
    def n_kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.d_head

    @property
    def kv_dim(self) -> int:
        return self.n_kv * self.d_head

    @property
    def gated(self) -> bool:
        """Gated FFN (SwiGLU): the first projection is 2 x ffn wide (gate and up)."""
        return self.activation in GATED_ACTIVATIONS

    @property
    def ffn_mats(self) -> int:
        """Weight matrices per FFN: 3 for SwiGLU (gate, up, down), 2 for GELU and squared ReLU."""
        return 3 if self.gated else 2

    def is_window_layer(self, i: int) -> bool:
        """Layer `i` (0-based) uses sliding-window attention."""
        if self.sliding_window <= 0:
            return False
        pat = self.window_pattern or "S"
        return pat[i % len(pat)] == "S"

    @property
    def window_layers(self) -> int:
        return sum(self.is_window_layer(i) for i in range(self.layers))

    def attention_span(self, i: int, seq: int) -> int:
        """Keys a query of layer `i` can attend to at most: the window, or the whole sequence."""
        return min(seq, self.sliding_window) if self.is_window_layer(i) else seq

    def mean_causal_context(self, i: int, seq: int) -> float:
        """Mean number of keys per query of layer `i` under the causal mask for a `seq`-token sequence
        (`causal_pairs` / seq): seq / 2 with full attention, as Megatron counts it; with a window W < seq,
        (W (W + 1) / 2 + (seq - W) W) / seq, at most seq / 2."""
        return causal_pairs(seq, self.attention_span(i, seq)) / seq

    def is_moe_layer(self, i: int) -> bool:
        m = self.moe
        if m is None or i < m.first_dense_layers:
            return False
        return (i - m.first_dense_layers) % m.layer_freq == m.layer_offset

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    @property
    def attn_score_dims(self) -> tuple[int, int]:
        """(qk head dim, v head dim) as the attention kernel sees them."""
        if self.mla:
            return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim, self.mla.v_head_dim
        return self.d_head, self.d_head

    # ------------------------------------------------------------ parameters
    def attn_params(self) -> int:
        h = self.hidden
        if self.mla:
            a = self.mla
            H = self.heads
            p = (h * a.q_lora_rank + a.q_lora_rank * H * (a.qk_nope_head_dim + a.qk_rope_head_dim)
                 + h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * H * (a.qk_nope_head_dim + a.v_head_dim)
                 + H * a.v_head_dim * h + a.q_lora_rank + a.kv_lora_rank)
            return p
        p = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.bias:
            p += self.q_dim + 2 * self.kv_dim + h
        if self.attention_sinks:
            p += self.heads
        return p

    def ffn_params(self, f: int) -> int:
        p = self.ffn_mats * self.hidden * f
        if self.bias:
            p += (self.ffn_mats - 1) * f + self.hidden
        return p

    def norm_params(self) -> int:
        per = self.hidden * (2 if self.norm == "layernorm" else 1)
        return 2 * per

    def layer_param_split(self, i: int) -> tuple[int, int, int]:
        """Parameters of layer `i` as parallelism splits them: (the rest of the layer, which tensor parallelism
        shards: attention, norms, router, a dense FFN; the shared experts, which it does not; the routed
        experts, which expert parallelism shards)."""
        total, _ = self.layer_params(i)
        if not self.is_moe_layer(i):
            return total, 0, 0
        m = self.moe
        routed = m.num_experts * self.ffn_params(m.expert_ffn)
        shared = m.shared_experts * self.ffn_params(m.shared_ffn)
        return total - routed - shared, shared, routed

    def layer_params(self, i: int) -> tuple[int, int]:
        """(total, active) parameters of layer `i`."""
        base = self.attn_params() + self.norm_params()
        if not self.is_moe_layer(i):
            f = self.ffn_params(self.ffn)
            return base + f, base + f
        m = self.moe
        e = self.ffn_params(m.expert_ffn)
        shared = m.shared_experts * self.ffn_params(m.shared_ffn)
        router = self.hidden * m.num_experts
        total = base + router + m.num_experts * e + shared
        active = base + router + m.top_k * e + shared
        return total, active

    def mtp_params(self) -> int:
        """Parameters of the multi-token-prediction modules (not in `param_count`): per module one layer of
        the last layer's kind, the 2h -> h projection and its two input norms (the embedding and output
        head are shared with the main model)."""
        if not self.mtp_layers:
            return 0
        per = self.layer_params(self.layers - 1)[0] + 2 * self.hidden * self.hidden + 2 * self.hidden
        return self.mtp_layers * per

    def embedding_params(self) -> int:
        p = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        if self.position == "learned":
            p += self.max_seq * self.hidden
        return p + self.hidden * (2 if self.norm == "layernorm" else 1)  # final norm

    def param_count(self) -> int:
        return self.embedding_params() + sum(self.layer_params(i)[0] for i in range(self.layers))

    def active_param_count(self, input_embedding: bool = True) -> int:
        """Parameters a token uses (MoE: top-k + shared experts).  `input_embedding=False` leaves out the
        input embedding table (a lookup, no matmul), as the GPT-OSS model card counts "active" parameters."""
        p = self.embedding_params() + sum(self.layer_params(i)[1] for i in range(self.layers))
        if not input_embedding and not self.tied_embeddings:
            p -= self.vocab * self.hidden
        return p

    # ------------------------------------------------------------ FLOPs
    def matmul_params_active(self) -> int:
        """Active parameters that take part in a matmul per token (no norms, no input embedding lookup,
        no learned positions; the output projection counts)."""
        p = 0
        for i in range(self.layers):
            _, act = self.layer_params(i)
            p += act - self.norm_params()
            if self.bias:
                p -= self.q_dim + 2 * self.kv_dim + self.hidden  # biases are adds, not matmuls
        return p + self.vocab * self.hidden

    def attention_flops_fwd_per_token(self, seq: int) -> float:
        """QK^T and AV of one token against `seq` keys, all layers, full square (no causal saving); a
        sliding-window layer against its window, the most keys its kernels ever read (the full square
        of a 32K sequence put a 128-token-window model's hardware FLOP/s above the GPU's peak)."""
        qk, v = self.attn_score_dims
        keys = seq * (self.layers - self.window_layers) + min(seq, self.sliding_window) * self.window_layers
        return 2.0 * keys * self.heads * (qk + v)

    def full_square_flops_per_token(self, seq: int) -> float:
        """Training FLOPs per token as the workload generator executes them with unfused attention:
        6 x active matmul params + 3 x full-square attention forward (the basis of hardware FLOPs)."""
        return 6.0 * self.matmul_params_active() + 3.0 * self.attention_flops_fwd_per_token(seq)

    def model_flops_per_token(self, seq: int) -> float:
        """Training (forward + backward) model FLOPs per token, no recomputation, in the project's one
        convention: Megatron-Core's (`megatron_flops_per_token`, see the module docstring)."""
        return megatron_flops_per_token(self, seq)

    # matmul shapes per layer, as the FLOP conventions count them (no biases, router, norms or sinks)
    def attn_matmul_params(self) -> int:
        """Attention projection weights of one layer (MLA: with its two latent norms, as Megatron counts)."""
        if self.mla:
            return self.attn_params()
        return 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim

    def mtp_module_matmul_params(self) -> int:
        """Matmul weights a token passes through in one MTP module, its output head apart: a layer of the
        last layer's kind and the 2h -> h projection of [embedding; hidden state]."""
        return self.attn_matmul_params() + self.ffn_matmul_params_active(self.layers - 1) + 2 * self.hidden ** 2

    def ffn_matmul_params_active(self, i: int) -> int:
        """FFN weights a token goes through in layer `i`: the dense FFN, or top-k routed + shared experts."""
        if not self.is_moe_layer(i):
            return self.ffn_mats * self.hidden * self.ffn
        m = self.moe
        return self.ffn_mats * self.hidden * (m.top_k * m.expert_ffn + m.shared_experts * m.shared_ffn)


def causal_pairs(seq: int, window: int = 0, doc: int = 0) -> float:
    """Score pairs of causal self-attention over `seq` tokens, s^2 / 2; packed documents of `doc` tokens
    attend within themselves; a sliding window lets a query see at most `window` keys (W (W+1) / 2 +
    (s - W) W, never more than the unwindowed s^2 / 2)."""
    if doc and doc < seq:
        return seq / doc * causal_pairs(doc, window)
    if 0 < window < seq:
        return min(seq * seq / 2.0, window * (window + 1) / 2.0 + (seq - window) * float(window))
    return seq * seq / 2.0



# ------------------------------------------------------------------ FLOP conventions
def _training_flops_per_token(m: ModelConfig, seq: int, *, causal: bool, windows: bool, mtp: bool,
                              logits_vocab: int, attention_seq: float | None, frozen: bool) -> float:
    """Training FLOPs per token at 2 FLOPs per multiply-add: matmuls of the layers a token passes through
    and the output projection (once per MTP module too) 3 x their forward (forward, data gradient, weight
    gradient; 2 x with `frozen` weights, LoRA: no weight gradient), attention scores / values 3 x their
    forward against the mean context.  `attention_seq` is the sequence length the attention term sees
    (packed SFT: sum s_i^2 / sum s_i over the packed sub-sequences); default `seq`.  Nothing for norms,
    router, biases, the embedding lookup or LoRA adapters."""
    qk, v = m.attn_score_dims
    s_att = float(attention_seq or seq)
    n_mtp = m.mtp_layers if mtp else 0
    weights, scores = 0.0, 0.0                   # forward FLOPs per token
    for i in range(m.layers + n_mtp):
        j = min(i, m.layers - 1)                 # MTP modules repeat the last layer's kind
        if causal:
            # Megatron counts a full causal layer as seq/2 keys per query (not (seq+1)/2)
            ctx = m.mean_causal_context(j, s_att) if windows else s_att / 2.0
        else:
            ctx = s_att
        if i < m.layers:
            weights += 2.0 * (m.attn_matmul_params() + m.ffn_matmul_params_active(j))
        scores += 2.0 * ctx * m.heads * (qk + v)
    weights += 2.0 * n_mtp * m.mtp_module_matmul_params()
    weights += 2.0 * m.hidden * logits_vocab * (1 + n_mtp)
    return (2.0 if frozen else 3.0) * weights + 3.0 * scores


def megatron_padded_vocab(vocab: int, divisible_by: int = 128, tp: int = 1) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP (the embedding
    and output layers really are that wide)."""
    step = divisible_by * tp
    return -(-vocab // step) * step


def megatron_flops_per_token(m: ModelConfig, seq: int, padded_vocab: int | None = None, *,
                             attention_seq: float | None = None, frozen: bool = False) -> float:
    """Model FLOPs per token, Megatron-Core convention (megatron/training `num_floating_point_operations`,
    as Megatron-Bridge 25.09+ reports "model TFLOP/s"): causal attention counted as half the square
    (seq/2 keys per query; sliding-window layers by their exact mean causal context), MTP modules counted
    (one more layer of the last kind + the 2h -> h projection + one more output projection each), output
    projection counted at the padded vocabulary (`megatron_padded_vocab`; default the real vocab), no
    embedding lookup, norms, router or biases.  Packed SFT: `attention_seq` = sum s_i^2 / sum s_i (Megatron-
    Bridge accumulates the squared sub-sequence lengths); LoRA: `frozen` (Megatron-Bridge counts the frozen
    matmuls at 2/3: no weight gradient)."""
    return _training_flops_per_token(m, seq, causal=True, windows=True, mtp=True, logits_vocab=padded_vocab or m.vocab,
                                     attention_seq=attention_seq, frozen=frozen)


def nemo_2407_flops_per_token(m: ModelConfig, seq: int, vocab: int | None = None, *,
                              attention_seq: float | None = None, frozen: bool = False) -> float:
    """Model FLOPs per token, NeMo 24.07 convention (nemo/utils/flops_formulas.py: gpt3, llama2, llama3,
    nemotron, mixtral; the NeMo 24.07 performance summary): attention scores / values over the FULL
    square (seq keys per query, 12 s h per layer), no sliding windows, no MTP, output projection at the
    family's vocabulary (LLM_VOCAB_SIZE_MAP: gpt3 51200, llama2 32000, llama3 128256, nemotron 256000,
    mixtral 32000; default the model's), no embedding lookup, norms, router or biases.  The 24.07 SFT and
    LoRA rows are reproduced only with `attention_seq` (the packed SQuAD sub-sequences) and, for LoRA,
    `frozen`; the pre-training rows with neither."""
    return _training_flops_per_token(m, seq, causal=False, windows=False, mtp=False, logits_vocab=vocab or m.vocab,
                                     attention_seq=attention_seq, frozen=frozen)


# name -> function(model, seq) -> training FLOPs per token
FLOP_CONVENTIONS = {"megatron": megatron_flops_per_token, "nemo-24.07": nemo_2407_flops_per_token}

# Which convention a published table's "model TFLOP/s" uses, by release (prefix of the release string in
# ../shared/reference/training-throughput.csv).  Checked: published TFLOP/s / tokens/s per GPU reproduces
# the convention's FLOPs per token within 0.5% on every row with both figures (tests/test_model_configs.py),
# except GPT-OSS 120B in 25.11 (see FLOP_CONVENTION_NOTES).
RELEASE_FLOP_CONVENTION = {
    "NeMo 24.03": "nemo-24.07",   # long-sequence table: TFLOP/s only; inferred (4K row = the 24.07 7B figure)
    "NeMo 24.07": "nemo-24.07",   # NVIDIA/NeMo docs/source/performance/performance_summary.md (rev 9c5c5e9709)
}   # and "megatron" for every Megatron-Bridge table (`megatron_bridge_release`)
# NeMo's own tables before Megatron-Bridge count with NeMo's flops_formulas, the 24.07 convention: besides
# 24.07's H100 rows, the NeMo Framework performance summaries of 25.02, 25.04 and 25.07 (docs.nvidia.com/
# nemo-framework/user-guide, performance-summary and archive/25.04-performance-summary) reproduce it within
# 0.2% on their B200 / GB200 pre-training rows (Llama 3 8B / 70B, Nemotron-4 15B / 340B, Mixtral 8x7B, GPT-3
# 175B; tests/test_model_configs.py), Megatron-Core's count being 1.4-11% lower; their Llama 3 405B rows come
# out 1% off (25.02, 25.04) or exact (25.07). A NeMo release before 25.09 that the table above does not name
# takes it too. Not checked: how those releases count their fine-tuning rows (24.07 counts packed SFT with
# no attention and LoRA's frozen weights without weight gradients).
FLOP_CONVENTION_NOTES = (
    "Megatron-Bridge 25.11 counts GPT-OSS 120B with every layer as full causal attention (no window) and "
    "its experts as 2-matrix FFNs (its clamped GLU is not recognised as SwiGLU): published 153 TFLOP/s at "
    "5630 tokens/s = 2.72e10 FLOPs/token, vs 3.26e10 in the convention as documented."
)


# the first NeMo container whose performance tables come from Megatron-Bridge's scripts
MEGATRON_BRIDGE_FIRST = (25, 9)


def nemo_release_version(release: str) -> tuple[int, int] | None:
    """(year, month) of a NeMo container release string ("NeMo 25.04", "NeMo 24.07 (rev ...)"); None for
    anything else, a framework version such as "NeMo 2.0" included."""
    v = re.match(r"\s*NeMo\s+(\d\d)\.(\d\d)(?!\d)", release)
    return (int(v.group(1)), int(v.group(2))) if v else None


def megatron_bridge_release(release: str) -> bool:
    """A table from Megatron-Bridge's performance scripts (Transformer Engine 2.x, Megatron-Core): its
    docs/performance-summary*.md names releases 'NeMo 25.09' onwards ('NeMo 26.04.01 SFT', ...); earlier
    NeMo releases ran NeMo 1.x or NeMo 2.x's own scripts."""
    if release.startswith("Megatron-Bridge"):
        return True
    v = nemo_release_version(release)
    return v is not None and v >= MEGATRON_BRIDGE_FIRST


def release_flop_convention(release: str) -> str:
    """The FLOP convention of a published release string ("NeMo 24.07 (rev ...)", "NeMo 25.11")."""
    for prefix, name in RELEASE_FLOP_CONVENTION.items():
        if release.startswith(prefix):
            return name
    if megatron_bridge_release(release):
        return "megatron"     # Megatron-Bridge docs/performance-summary-archive.md count as Megatron-Core
    if nemo_release_version(release) is not None:
        return "nemo-24.07"   # NeMo's tables before Megatron-Bridge (see RELEASE_FLOP_CONVENTION)
    raise TraceInputError(None, f"no known FLOP convention for release {release!r} "
                                f"(known: NeMo releases: before 25.09 NeMo's, from 25.09 Megatron-Core's)")


# ------------------------------------------------------------------ loading
_TOP_KEYS = {f.name for f in fields(ModelConfig)} - {"moe", "mla"}
_TABLES = {"moe": MoEConfig, "mla": MLAConfig}


def model_from_dict(data: dict[str, Any], path: str = "<model>") -> ModelConfig:
    """Typed `ModelConfig` from a parsed TOML table; unknown keys and wrong types raise
    `TraceInputError` naming the key."""
    reject_unknown_keys(path, data, _TOP_KEYS | set(_TABLES))
    kwargs: dict[str, Any] = {}
    types = {f.name: f.type for f in fields(ModelConfig)}
    for key, value in data.items():
        if key in _TABLES:
            if not isinstance(value, dict):
                raise TraceInputError(path, f"'{key}' must be a table")
            cls = _TABLES[key]
            allowed = {f.name for f in fields(cls)}
            reject_unknown_keys(path, value, allowed, prefix=f"{key}.")
            missing = [f.name for f in fields(cls) if f.name not in value and f.default is MISSING]
            if missing:
                raise TraceInputError(path, f"missing key '{key}.{missing[0]}'")
            sub_types = {f.name: str(f.type) for f in fields(cls)}
            for k, v in value.items():
                if sub_types[k] == "str":
                    if not isinstance(v, str):
                        raise TraceInputError(path, f"'{key}.{k}' must be a string, got {v!r}")
                elif not isinstance(v, int) or isinstance(v, bool):
                    raise TraceInputError(path, f"'{key}.{k}' must be an integer, got {v!r}")
            try:
                kwargs[key] = cls(**value)
            except TraceInputError as e:
                raise with_path(e, path) from None
            continue
        want = types[key]
        if key == "aliases":
            if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
                raise TraceInputError(path, f"'aliases' must be a list of names, got {value!r}")
            kwargs[key] = tuple(value)
            continue
        ok = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "str": lambda v: isinstance(v, str),
              "bool": lambda v: isinstance(v, bool)}.get(str(want), lambda v: True)
        if not ok(value):
            raise TraceInputError(path, f"'{key}' must be {want}, got {value!r}")
        try:
            kwargs[key] = float(value) if str(want) == "float" else value
        except OverflowError:   # an integer past the float range
            raise TraceInputError(path, f"'{key}' must be a finite number, got {value}") from None
    for key in ("name", "layers", "hidden", "heads", "vocab"):
        if key not in kwargs:
            raise TraceInputError(path, f"missing key '{key}'")
    kwargs.setdefault("ffn", 0)
    try:
        return ModelConfig(**kwargs)
    except TraceInputError as e:
        raise with_path(e, path) from None


def _validate(cfg: ModelConfig) -> None:
    """Ranges and cross-field rules (raised without a path; `model_from_dict` adds the file)."""
    def bad(msg: str) -> None:
        raise TraceInputError(None, msg)

    if not isinstance(cfg.name, str) or not cfg.name:
        bad("'name' must be a non-empty string")
    _check_count("'layers'", cfg.layers, 1, MAX_LAYERS)
    for key in ("hidden", "heads", "vocab"):
        _check_count(f"'{key}'", getattr(cfg, key), 1, MAX_DIM)
    for key in ("ffn", "kv_heads", "head_dim", "max_seq"):
        _check_count(f"'{key}'", getattr(cfg, key), 0, MAX_DIM)
    for key in ("published_params_b", "published_active_params_b"):
        check_number(f"'{key}'", getattr(cfg, key), 0)
    if cfg.activation not in ACTIVATIONS:
        bad(f"'activation' must be one of {', '.join(ACTIVATIONS)}, got {cfg.activation!r}")
    check_number("'glu_clamp'", cfg.glu_clamp, 0)
    if cfg.glu_clamp and cfg.activation not in GATED_ACTIVATIONS:
        bad(f"'glu_clamp' must be >= 0 and needs a gated activation, got {cfg.glu_clamp!r} with "
            f"{cfg.activation!r}")
    check_number("'rope_mscale'", cfg.rope_mscale, 0, 100, low_open=True)
    _check_count("'mtp_layers'", cfg.mtp_layers, 0, MAX_LAYERS)
    _check_count("'sliding_window'", cfg.sliding_window, 0, MAX_DIM)
    if not isinstance(cfg.window_pattern, str) or set(cfg.window_pattern) - {"S", "F"}:
        bad(f"'window_pattern' must be a string of 'S' (windowed) and 'F' (full) layers, got {cfg.window_pattern!r}")
    if cfg.window_pattern and cfg.sliding_window <= 0:
        bad("'window_pattern' needs 'sliding_window' (the window in tokens) > 0")
    if cfg.norm not in ("rmsnorm", "layernorm"):
        bad(f"'norm' must be 'rmsnorm' or 'layernorm', got {cfg.norm!r}")
    if cfg.position not in ("rope", "learned"):
        bad(f"'position' must be 'rope' or 'learned', got {cfg.position!r}")
    if cfg.position == "learned" and cfg.max_seq < 1:
        bad("'max_seq' (the learned position table) must be >= 1 with position = 'learned'")
    if cfg.heads % cfg.n_kv:
        bad(f"'heads' ({cfg.heads}) must be a multiple of 'kv_heads' ({cfg.n_kv})")
    if cfg.moe is None and cfg.ffn <= 0:
        bad("'ffn' must be positive for a dense model")
    if cfg.moe is not None and (cfg.moe.first_dense_layers or cfg.moe.layer_freq > 1) and cfg.ffn <= 0:
        bad("'ffn' (dense FFN size) is needed for the dense layers")


def model_from_hf(data: Any, path: str | os.PathLike = "<config.json>", name: str | None = None) -> ModelConfig:
    """`ModelConfig` from a parsed Hugging Face config.json object (`estimators.hf_config` reads the
    families' fields into a model table; it is checked like a zoo TOML)."""
    return model_from_dict(hf_model_table(data, path, name), str(path))


def load_hf_config(path: str | os.PathLike) -> ModelConfig:
    """Read a config.json (or a directory holding one) into a `ModelConfig`."""
    data, p = read_hf_json(path)
    return model_from_hf(data, p)


def load_model_file(path: str | os.PathLike) -> ModelConfig:
    """A model TOML file, or a Hugging Face config.json (`estimators.hf_config`)."""
    p = Path(path)
    if p.suffix.lower() == ".json" or p.name.lower().endswith(".json.gz") or _looks_like_json(p):
        return load_hf_config(p)
    data = read_toml(p, "model file")
    return model_from_dict(data, str(p))


def _looks_like_json(p: Path) -> bool:
    """A model file named otherwise (`config.JSON`, no extension) that holds a JSON object or is gzipped."""
    try:
        with open(p, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return False
    return head[:2] == b"\x1f\x8b" or head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"{"


def zoo_names() -> list[str]:
    return sorted(p.stem for p in ZOO_DIR.glob("*.toml"))


def _norm(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def load_model(name_or_path: str | os.PathLike) -> ModelConfig:
    """A zoo model by name (case and punctuation ignored: "Llama 3 8B", "llama3-8b"), a model TOML path, or a
    Hugging Face config.json path (or a directory holding one)."""
    s = str(name_or_path)
    if s.lower().endswith((".json", ".json.gz")) or Path(s).is_dir():
        return load_hf_config(s)
    if s.endswith(".toml") or os.sep in s or Path(s).is_file():
        return load_model_file(s)
    want = _norm(s)
    for stem in zoo_names():
        cfg_path = ZOO_DIR / f"{stem}.toml"
        if _norm(stem) == want:
            return load_model_file(cfg_path)
    for stem in zoo_names():  # display names ("Llama 3 405B")
        cfg = load_model_file(ZOO_DIR / f"{stem}.toml")
        if want in {_norm(cfg.display_name), _norm(cfg.name), *map(_norm, cfg.aliases)}:
            return cfg
    raise TraceInputError(None, f"unknown model '{s}' (zoo: {', '.join(zoo_names())}; or give a model .toml or a Hugging Face config.json path)")
