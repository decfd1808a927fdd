"""Hugging Face `config.json` -> a model table (the shape of a zoo TOML), so `--model path/to/config.json` (or a directory holding one)
works for the architectures of the ecosystem without writing our TOML.

One reader per architecture family, registered by the config's `model_type` (a registry: add a family by
adding a function).  Every family reads the common transformer fields (hidden_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, head_dim, vocab_size, tie_word_embeddings, and a YaRN `rope_scaling`'s
attention temperature, rope_mscale) and its own:
- llama / mistral / qwen2 / qwen3: dense, gated FFN (intermediate_size); mistral's `sliding_window`,
  qwen2/3's `use_sliding_window` + `max_window_layers`, or any `layer_types` list give the windowed layers
- mixtral: num_local_experts, num_experts_per_tok, intermediate_size = one expert's FFN
- qwen2_moe / qwen3_moe: num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size
  (one shared expert of that width), decoder_sparse_step, mlp_only_layers (a leading range), intermediate_size
  for the dense layers
- deepseek_v3 / kimi_k2 (and deepseek_v2 with q_lora_rank): MLA (q_lora_rank, kv_lora_rank, qk_rope_head_dim,
  qk_nope_head_dim, v_head_dim), n_routed_experts, n_shared_experts, moe_intermediate_size,
  first_k_dense_replace, moe_layer_freq, n_group / topk_group, scoring_func, num_nextn_predict_layers (MTP)
- gpt_oss: num_local_experts, experts_per_token / num_experts_per_tok, intermediate_size (expert FFN),
  sliding_window + layer_types, attention sinks, linear biases (attention_bias)
- nemotron: hidden_act relu2 (squared ReLU, a 2-matrix FFN), LayerNorm
The FFN of every family but nemotron is gated (3 matrices) whatever `hidden_act` names the nonlinearity:
parameters and FLOPs depend on the gating, not on SiLU vs GELU.  Qwen2's q/k/v biases and Qwen3's q/k
norms (< 0.01% of the parameters) are not counted.  A config with the model under `text_config` (multimodal
wrappers) is read from there.

Bad input is one line naming the file and the problem: not JSON, not an object, a missing field (named),
a field of the wrong type, an unknown model_type (with the supported ones).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable

from chakra_schema.errors import MAX_CONFIG_BYTES, TraceInputError, check_number, printable, with_path
from chakra_schema.safe_io import read_json_input

_MISSING = object()


class _Fields:
    """Typed access to a config.json object: a missing or mistyped field raises a one-line error naming it."""

    def __init__(self, data: dict[str, Any], model_type: str):
        self.data = data
        self.model_type = model_type

    def _get(self, key: str, default: Any) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                what = "missing field" if value is _MISSING else "required field is null:"
                raise TraceInputError(None, f"{what} '{key}' (model_type '{self.model_type}')")
            return default
        return value

    def int(self, key: str, default: Any = _MISSING, low: int = 1) -> int:
        value = self._get(key, default)
        if value is None:
            return value
        if not isinstance(value, int) or isinstance(value, bool):
            raise TraceInputError(None, f"field '{key}' must be an integer, got {value!r}")
        if value < low:
            raise TraceInputError(None, f"field '{key}' must be >= {low}, got {value}")
        return value

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise TraceInputError(None, f"field '{key}' must be true or false, got {value!r}")
        return value

    def str(self, key: str, default: Any = _MISSING) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise TraceInputError(None, f"field '{key}' must be a string, got {value!r}")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self._get(key, [])
        if not isinstance(value, list) or any(not isinstance(v, int) or isinstance(v, bool) for v in value):
            raise TraceInputError(None, f"field '{key}' must be a list of integers, got {value!r}")
        return value

    def first(self, *keys: str, default: Any = _MISSING) -> int:
        """The first of several spellings present (transformers versions rename fields)."""
        for key in keys:
            if self.data.get(key) is not None:
                return self.int(key)
        if default is _MISSING:
            raise TraceInputError(None, f"missing field '{keys[0]}' (model_type '{self.model_type}')")
        return default


# ------------------------------------------------------------------ common pieces
def _base(f: _Fields) -> dict[str, Any]:
    """Fields every decoder-only family shares."""
    heads = f.int("num_attention_heads")
    hidden = f.int("hidden_size")
    kw: dict[str, Any] = {
        "layers": f.int("num_hidden_layers"),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": f.int("num_key_value_heads", heads),
        "vocab": f.int("vocab_size"),
        "tied_embeddings": f.bool("tie_word_embeddings", False),
    }
    head_dim = f.first("head_dim", "kv_channels", default=0)
    if head_dim and head_dim != hidden // heads:
        kw["head_dim"] = head_dim
    elif not head_dim and hidden < heads:
        raise TraceInputError(None, f"field 'hidden_size' ({hidden}) is smaller than 'num_attention_heads' ({heads}) "
                                    "and no 'head_dim' is given: a head would have no dimensions")
    mscale = _rope_mscale(f)
    if mscale != 1.0:
        kw["rope_mscale"] = mscale
    return kw


def _rope_mscale(f: _Fields) -> float:
    """YaRN's attention temperature as Megatron-Core computes it from the config Megatron-Bridge maps
    (`rope_scaling`, or transformers v5's `rope_parameters`: factor, mscale, mscale_all_dim):
    (0.1 mscale ln(factor) + 1) / (0.1 mscale_all_dim ln(factor) + 1) when both are given, else
    0.1 ln(factor) + 1 (1 for factor <= 1). `attention_factor` is not read: Bridge does not map it. 1.0
    without YaRN (none, linear, dynamic, llama3 scaling)."""
    key = "rope_scaling" if f.data.get("rope_scaling") is not None else "rope_parameters"
    scaling = f.data.get(key)
    if scaling is None:
        return 1.0
    if not isinstance(scaling, dict):
        raise TraceInputError(None, f"field '{key}' must be an object, got {scaling!r}")
    if scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0

    def number(name: str) -> float | None:
        value = scaling.get(name)
        if value is not None:
            check_number(f"field '{key}.{name}'", value, 0, 1e6)
            value = float(value)
        return value

    factor = number("factor") or 1.0

    def temperature(m: float) -> float:
        return 1.0 if factor <= 1.0 else 0.1 * m * math.log(factor) + 1.0

    mscale, mscale_all_dim = number("mscale"), number("mscale_all_dim")
    if mscale is None or mscale_all_dim is None:
        return temperature(1.0)
    return temperature(mscale) / temperature(mscale_all_dim)


def _window(f: _Fields, layers: int) -> dict[str, Any]:
    """Sliding-window layers: an explicit `layer_types` list wins; else qwen2/3's use_sliding_window (layers
    from max_window_layers on are windowed); else a non-null `sliding_window` windows every layer (Mistral)."""
    window = f.int("sliding_window", 0, low=0) or 0
    types = f.data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or any(
                t not in ("sliding_attention", "full_attention") for t in types):
            raise TraceInputError(None, f"field 'layer_types' must list 'sliding_attention' / 'full_attention' "
                                        f"for each of the {layers} layers")
        pattern = "".join("S" if t == "sliding_attention" else "F" for t in types)
        if "S" not in pattern or not window:
            return {}
        return {"sliding_window": window, "window_pattern": _shortest_period(pattern)}
    if "use_sliding_window" in f.data:
        if not f.bool("use_sliding_window") or not window:
            return {}
        first = min(f.int("max_window_layers", layers, low=0), layers)
        if first >= layers:
            return {}
        return {"sliding_window": window, "window_pattern": "F" * first + "S" * (layers - first)}
    return {"sliding_window": window} if window else {}


def _shortest_period(pattern: str) -> str:
    """"SFSF...SF" -> "SF": the shortest prefix that repeats to the whole pattern (the pattern itself if none)."""
    n = len(pattern)
    for p in range(1, n + 1):
        if n % p == 0 and pattern[:p] * (n // p) == pattern:
            return pattern[:p]
    return pattern


def _router(f: _Fields) -> str:
    scoring = f.str("scoring_func", "softmax")
    if scoring not in ("softmax", "sigmoid"):
        raise TraceInputError(None, f"field 'scoring_func' must be 'softmax' or 'sigmoid', got {scoring!r}")
    return scoring


# ------------------------------------------------------------------ families
def _dense(f: _Fields) -> dict[str, Any]:
    kw = _base(f)
    kw["ffn"] = f.int("intermediate_size")
    kw.update(_window(f, kw["layers"]))
    return kw


def _nemotron(f: _Fields) -> dict[str, Any]:
    kw = _dense(f)
    act = f.str("hidden_act", "relu2")
    if act != "relu2":
        raise TraceInputError(None, f"field 'hidden_act' must be 'relu2' for model_type 'nemotron', got {act!r}")
    kw.update(activation="squared_relu", norm="layernorm")
    return kw


def _mixtral(f: _Fields) -> dict[str, Any]:
    kw = _base(f)
    kw.update(_window(f, kw["layers"]))
    kw["ffn"] = 0
    kw["moe"] = dict(num_experts=f.first("num_local_experts", "num_experts"), top_k=f.int("num_experts_per_tok"),
                     expert_ffn=f.int("intermediate_size"))
    return kw


def _qwen_moe(f: _Fields) -> dict[str, Any]:
    kw = _base(f)
    kw.update(_window(f, kw["layers"]))
    layers = kw["layers"]
    step = f.int("decoder_sparse_step", 1)
    dense = sorted(set(f.int_list("mlp_only_layers")))
    if dense != list(range(len(dense))):
        raise TraceInputError(None, f"field 'mlp_only_layers' must be a leading range of layers (0, 1, ...), got {dense}")
    if dense and step != 1:
        raise TraceInputError(None, "'mlp_only_layers' together with 'decoder_sparse_step' > 1 is not supported")
    # HF: layer i is MoE when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers
    shared_ffn = f.int("shared_expert_intermediate_size", 0, low=0) or 0
    expert_ffn = f.int("moe_intermediate_size")
    kw["ffn"] = f.int("intermediate_size") if (dense or step > 1) else 0   # dense FFN only where a layer is dense
    kw["moe"] = dict(num_experts=f.first("num_experts", "num_local_experts"), top_k=f.int("num_experts_per_tok"),
                     expert_ffn=expert_ffn, shared_experts=1 if shared_ffn else 0,
                     shared_expert_ffn=shared_ffn if shared_ffn and shared_ffn != expert_ffn else 0,
                     layer_freq=step, layer_offset=step - 1, first_dense_layers=len(dense))
    # the first MoE layer: after the dense range, or at decoder_sparse_step - 1 (the two are not combined)
    _require_moe_layer(layers, kw["moe"], "field mlp_only_layers leaves" if step == 1
                       else f"field decoder_sparse_step ({step}) leaves")
    return kw


def _deepseek(f: _Fields) -> dict[str, Any]:
    kw = _base(f)
    kw.pop("kv_heads", None)       # MLA: num_key_value_heads is nominal (= heads)
    kw.pop("head_dim", None)
    kw["ffn"] = f.int("intermediate_size")
    q_lora = f.int("q_lora_rank", None)
    if q_lora is None:
        raise TraceInputError(None, "field 'q_lora_rank' is null (MLA without query compression, DeepSeek-V2-Lite) "
                                    "is not supported")
    kw["mla"] = dict(q_lora_rank=q_lora, kv_lora_rank=f.int("kv_lora_rank"),
                     qk_rope_head_dim=f.int("qk_rope_head_dim"), qk_nope_head_dim=f.int("qk_nope_head_dim"),
                     v_head_dim=f.int("v_head_dim"))
    first_dense = f.int("first_k_dense_replace", 0, low=0)
    freq = f.int("moe_layer_freq", 1)
    kw["moe"] = dict(num_experts=f.int("n_routed_experts"), top_k=f.int("num_experts_per_tok"),
                     expert_ffn=f.int("moe_intermediate_size"), shared_experts=f.int("n_shared_experts", 0, low=0),
                     first_dense_layers=first_dense,
                     # HF: layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0
                     layer_freq=freq, layer_offset=(-first_dense) % freq,
                     groups=f.int("n_group", 1), groups_per_token=f.int("topk_group", 1), router=_router(f))
    moe = kw["moe"]
    if moe["groups_per_token"] > moe["groups"]:
        raise TraceInputError(None, f"field 'topk_group' ({moe['groups_per_token']}) must not exceed 'n_group' "
                                    f"({moe['groups']})")
    if moe["num_experts"] % moe["groups"]:
        raise TraceInputError(None, f"field 'n_group' ({moe['groups']}) must divide 'n_routed_experts' "
                                    f"({moe['num_experts']})")
    _require_moe_layer(kw["layers"], kw["moe"], "fields first_k_dense_replace / moe_layer_freq leave")
    kw["mtp_layers"] = f.int("num_nextn_predict_layers", 0, low=0)
    return kw


def _require_moe_layer(layers: int, moe: dict, fields: str) -> None:
    """An MoE config whose layout leaves every layer dense is a mistake, not a dense model. `moe`: the layout
    as the model reads it (ModelConfig.is_moe_layer's rule); `fields`: what leaves them so, as the message says
    it ("fields a / b leave")."""
    first, freq, offset = moe["first_dense_layers"], moe["layer_freq"], moe["layer_offset"]
    if not any(i >= first and (i - first) % freq == offset for i in range(layers)):
        raise TraceInputError(None, f"{fields} no MoE layer among the {layers} layers")


def _gpt_oss(f: _Fields) -> dict[str, Any]:
    kw = _base(f)
    kw.update(_window(f, kw["layers"]))
    kw["ffn"] = 0
    kw["bias"] = f.bool("attention_bias", True)   # q/k/v/o biases; the experts carry biases too
    kw["attention_sinks"] = True
    limit = f.data.get("swiglu_limit", 7.0)        # the released configs: 7.0
    check_number("field 'swiglu_limit'", limit, 0)
    kw["glu_clamp"] = limit                        # model_from_dict makes it a float (refusing one past float range)
    kw["moe"] = dict(num_experts=f.first("num_local_experts", "num_experts"),
                     top_k=f.first("num_experts_per_tok", "experts_per_token"),
                     expert_ffn=f.int("intermediate_size"))
    return kw


FAMILIES: dict[str, Callable[[_Fields], dict[str, Any]]] = {
    "llama": _dense, "mistral": _dense, "qwen2": _dense, "qwen3": _dense,
    "nemotron": _nemotron,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe,
    "deepseek_v3": _deepseek, "kimi_k2": _deepseek, "deepseek_v2": _deepseek,
    "gpt_oss": _gpt_oss,
}

# `architectures` names -> model_type, for configs that omit model_type
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "NemotronForCausalLM": "nemotron", "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV2ForCausalLM": "deepseek_v2", "GptOssForCausalLM": "gpt_oss",
}


def _model_type(data: dict[str, Any]) -> str:
    mt = data.get("model_type")
    if mt is not None:
        if not isinstance(mt, str):
            raise TraceInputError(None, f"field 'model_type' must be a string, got {mt!r}")
        if mt not in FAMILIES:
            raise TraceInputError(None, f"unknown model_type '{mt}' (supported: {', '.join(sorted(FAMILIES))})")
        return mt
    archs = data.get("architectures")
    named = []
    if isinstance(archs, list):
        for a in archs:
            if isinstance(a, str) and a in _ARCHITECTURES:   # entries of other types ({}, []) are unhashable
                return _ARCHITECTURES[a]
            if isinstance(a, str):
                named.append(a)
    which = f" ({', '.join(named)} is not one of: {', '.join(sorted(_ARCHITECTURES))})" if named else ""
    raise TraceInputError(None, f"missing field 'model_type' and no known 'architectures' entry{which}")


def hf_model_table(data: Any, path: str | os.PathLike = "<config.json>", name: str | None = None) -> dict[str, Any]:
    """The model table (the keys of a zoo TOML, `moe` / `mla` as sub-tables) of a parsed Hugging Face
    config.json object; errors name `path` and the field.  `estimators.model_config.model_from_hf` turns it
    into a `ModelConfig` (this module does not import model_config: no import loop)."""
    try:
        if not isinstance(data, dict):
            raise TraceInputError(None, f"must be a JSON object, got {type(data).__name__}")
        inner = ""
        if "hidden_size" not in data and isinstance(data.get("text_config"), dict):
            data = data["text_config"]            # multimodal wrapper: the language model's config
            inner = "its text_config: "
        try:
            mt = _model_type(data)
            kw = FAMILIES[mt](_Fields(data, mt))
        except TraceInputError as e:
            raise TraceInputError(None, inner + e.problem) if inner else e
        label = name or _name(data, path)
        return dict(name=label, display_name=label, source=f"Hugging Face config.json ({mt}): {path}", **kw)
    except TraceInputError as e:
        raise with_path(e, path) from None


def _name(data: dict[str, Any], path: str | os.PathLike) -> str:
    given = data.get("_name_or_path")
    if isinstance(given, str):
        given = printable(given).strip()   # no terminal escapes in a table title
        if given.rstrip("/"):
            return given.rstrip("/").split("/")[-1][:80]
    p = Path(path)
    return p.parent.name if p.name == "config.json" and p.parent.name else p.stem


def read_hf_json(path: str | os.PathLike) -> tuple[Any, Path]:
    """The parsed config.json at `path` (gzipped too, or in the directory `path`), and the file's path."""
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").exists():
            raise TraceInputError(p, "is a directory without a config.json")
        p = p / "config.json"
    if not p.exists():
        raise TraceInputError(p, "config.json not found")
    try:
        # the bounded reader gunzips when the file starts with the gzip magic, and refuses a file (or a gzip
        # that decompresses to) more than a config.json ever holds
        data = read_json_input(p, limit=MAX_CONFIG_BYTES, what="config.json")
        return json.loads(data.decode("utf-8-sig")), p
    except TraceInputError:
        raise
    except (ValueError, RecursionError) as e:  # JSON / UTF-8 errors, an integer past the int-parsing digit limit,
        raise TraceInputError(p, f"not valid JSON: {e}") from None   # RecursionError: nested too deeply
