"""Typed model architecture (`ModelConfig`), loaded from TOML (the model zoo in `estimators/zoo/` or a
user file), with parameter and FLOP counts derived from the architecture.

Counting rules (per layer, no biases unless `bias = true`):
- attention, GQA/MHA: q = h*H*d, k = v = h*K*d, o = H*d*h  (H query heads, K kv heads, d head dim)
- attention, MLA (DeepSeek V2/V3): q_a = h*q_lora, q_b = q_lora*H*(nope+rope), kv_a = h*(kv_lora+rope),
  kv_b = kv_lora*H*(nope+v), o = H*v*h, plus the two latent norms
- FFN: gelu = 2*h*f, swiglu = 3*h*f; MoE layer = router h*E + E routed + S shared experts
- embeddings: vocab*h, doubled when the output projection is untied; learned positions add seq*h.
Training FLOPs follow the usual 2 FLOPs per multiply-add: forward = 2 * active matmul params * tokens
plus attention scores/values 4 * tokens * seq_kv * H * d (full square, as Narayanan et al. 2021 count it).
"""
from __future__ import annotations

import os
import sys
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from chakra_schema.errors import TraceInputError, check_number, reject_unknown_keys, with_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ZOO_DIR = Path(__file__).resolve().parent / "zoo"


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int                  # routed experts
    top_k: int                        # routed experts per token
    expert_ffn: int                   # hidden size of one expert's FFN
    shared_experts: int = 0           # always-active experts of the same size
    layer_freq: int = 1               # MoE every `layer_freq` layers (Maverick: 2)
    first_dense_layers: int = 0       # leading dense layers (DeepSeek V3: 3)
    # With layer_freq 2, which layers are MoE: layer i (0-based, after the dense prefix) is MoE when
    # i % layer_freq == layer_offset.  Maverick interleaves dense and MoE layers starting with dense.
    layer_offset: int = 0

    def __post_init__(self) -> None:
        for key in ("num_experts", "top_k", "expert_ffn", "layer_freq"):
            check_number(f"'moe.{key}'", getattr(self, key), 1, integer=True)
        for key in ("shared_experts", "first_dense_layers", "layer_offset"):
            check_number(f"'moe.{key}'", getattr(self, key), 0, integer=True)
        if self.top_k > self.num_experts:
            raise TraceInputError(None, "'moe.top_k' must be between 1 and 'moe.num_experts'")
        if self.layer_offset >= self.layer_freq:
            raise TraceInputError(None, "'moe.layer_freq' must be >= 1 and 'moe.layer_offset' < it")


@dataclass(frozen=True)
class MLAConfig:
    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int

    def __post_init__(self) -> None:
        for f in fields(self):
            check_number(f"'mla.{f.name}'", getattr(self, f.name), 1, integer=True)


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
    activation: str = "swiglu"         # "swiglu" | "gelu"
    norm: str = "rmsnorm"              # "rmsnorm" | "layernorm"
    tied_embeddings: bool = False
    position: str = "rope"             # "rope" | "learned"
    max_seq: int = 0                   # learned position table length
    bias: bool = False                 # linear-layer biases (GPT-3)
    display_name: str = ""
    source: str = ""                   # where the architecture facts come from
    published_params_b: float = 0.0    # published total parameters (billions), for checks
    published_active_params_b: float = 0.0
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
    def ffn_mats(self) -> int:
        """Weight matrices per FFN: 3 for SwiGLU (gate, up, down), 2 for GELU."""
        return 3 if self.activation == "swiglu" else 2

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
        return p

    def ffn_params(self, f: int) -> int:
        p = self.ffn_mats * self.hidden * f
        if self.bias:
            p += (self.ffn_mats - 1) * f + self.hidden
        return p

    def norm_params(self) -> int:
        per = self.hidden * (2 if self.norm == "layernorm" else 1)
        return 2 * per

    def layer_params(self, i: int) -> tuple[int, int]:
        """(total, active) parameters of layer `i`."""
        base = self.attn_params() + self.norm_params()
        if not self.is_moe_layer(i):
            f = self.ffn_params(self.ffn)
            return base + f, base + f
        m = self.moe
        e = self.ffn_params(m.expert_ffn)
        router = self.hidden * m.num_experts
        total = base + router + (m.num_experts + m.shared_experts) * e
        active = base + router + (m.top_k + m.shared_experts) * e
        return total, active

    def embedding_params(self) -> int:
        p = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        if self.position == "learned":
            p += self.max_seq * self.hidden
        return p + self.hidden * (2 if self.norm == "layernorm" else 1)  # final norm

    def param_count(self) -> int:
        return self.embedding_params() + sum(self.layer_params(i)[0] for i in range(self.layers))

    def active_param_count(self) -> int:
        return self.embedding_params() + sum(self.layer_params(i)[1] for i in range(self.layers))

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
        """QK^T and AV of one token against `seq` keys, all layers, full square (no causal saving)."""
        qk, v = self.attn_score_dims
        return 2.0 * seq * self.heads * (qk + v) * self.layers

    def model_flops_per_token(self, seq: int) -> float:
        """Training (forward + backward) model FLOPs per token, no recomputation:
        6 x active matmul params + 3 x attention forward."""
        return 6.0 * self.matmul_params_active() + 3.0 * self.attention_flops_fwd_per_token(seq)


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
            for k, v in value.items():
                if not isinstance(v, int) or isinstance(v, bool):
                    raise TraceInputError(path, f"'{key}.{k}' must be an integer, got {v!r}")
            try:
                kwargs[key] = cls(**value)
            except TraceInputError as e:
                raise with_path(e, path) from None
            continue
        want = types[key]
        ok = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "str": lambda v: isinstance(v, str),
              "bool": lambda v: isinstance(v, bool)}.get(str(want), lambda v: True)
        if not ok(value):
            raise TraceInputError(path, f"'{key}' must be {want}, got {value!r}")
        kwargs[key] = float(value) if str(want) == "float" else value
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
    for key in ("layers", "hidden", "heads", "vocab"):
        check_number(f"'{key}'", getattr(cfg, key), 1, integer=True)
    for key in ("ffn", "kv_heads", "head_dim", "max_seq"):
        check_number(f"'{key}'", getattr(cfg, key), 0, integer=True)
    for key in ("published_params_b", "published_active_params_b"):
        check_number(f"'{key}'", getattr(cfg, key), 0)
    if cfg.activation not in ("swiglu", "gelu"):
        bad(f"'activation' must be 'swiglu' or 'gelu', got {cfg.activation!r}")
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


def load_model_file(path: str | os.PathLike) -> ModelConfig:
    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise TraceInputError(p, "model file not found") from None
    except IsADirectoryError:
        raise TraceInputError(p, "is a directory, not a model .toml file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nested too deeply
        raise TraceInputError(p, f"not valid TOML: {e}") from None
    except OSError as e:
        raise TraceInputError(p, f"cannot read: {e.strerror or e}") from None
    return model_from_dict(data, str(p))


def zoo_names() -> list[str]:
    return sorted(p.stem for p in ZOO_DIR.glob("*.toml"))


def _norm(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def load_model(name_or_path: str | os.PathLike) -> ModelConfig:
    """A zoo model by name (case and punctuation ignored: "Llama 3 8B", "llama3-8b") or a TOML path."""
    s = str(name_or_path)
    if s.endswith(".toml") or os.sep in s or Path(s).is_file():
        return load_model_file(s)
    want = _norm(s)
    for stem in zoo_names():
        cfg_path = ZOO_DIR / f"{stem}.toml"
        if _norm(stem) == want:
            return load_model_file(cfg_path)
    for stem in zoo_names():  # display names ("Llama 3 405B")
        cfg = load_model_file(ZOO_DIR / f"{stem}.toml")
        if _norm(cfg.display_name) == want or _norm(cfg.name) == want:
            return cfg
    raise TraceInputError(None, f"unknown model '{s}' (zoo: {', '.join(zoo_names())}; or give a .toml path)")
