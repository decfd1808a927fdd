"""Published H100 training runs (`shared/reference/training-throughput.csv`) as parallelism what-ifs.

Each CSV row names a model, a GPU count and the published layout (TP, PP, CP, VP, EP, ETP, micro/global
batch, sequence, recompute, FSDP, precision / FP8 recipe) with the throughput it reached. `row_scenario`
turns a row into the model + `ParallelPlan` it ran, unchanged; `run_rows` predicts every row and compares
tokens/s per GPU (TFLOP/s where the row has no tokens/s). The `lumos-sim check` case kind
`kind = "published_training"` (see `lumos_sim.check`) and `benchmarks/published_training.py` use it.

Reading the columns (facts of the releases, not fitted):
- precision "FP8" in NeMo 24.x = Transformer Engine delayed scaling; "FP8-CS" = current (tensorwise)
  scaling; "FP8" in Megatron-Bridge 25.09 rows = current scaling as well (its performance recipes'
  default, `bf16_with_fp8_current_scaling_mixed`); "FP8-MX" / "MXFP8" = MX block scaling, which only
  Blackwell presets run (`row_precision`; FP4 formats are an error for the row).
- the dispatcher, overlap and layout settings read from the releases' scripts (`MOE_SCRIPT_SETTINGS`,
  `SCRIPT_RAN_OTHERWISE`, `FINETUNE_SCRIPT_LAYOUTS`) are their H100 scripts': rows on other GPUs take none
  of those three tables (the recipes' general settings below, TP overlap, cuDNN attention, bf16 gradients,
  fused cross entropy, apply on every GPU). A row with an empty `gpu` column counts as H100, the record's.
- recompute "full,block,N layers" = full recompute of N layers per chunk; "selective (a, b)" = those
  modules; fsdp N = Megatron-FSDP (ZeRO-3) over N GPUs.
- release "SFT" / "LoRA" rows are fine-tuning (packed sequences; LoRA: frozen base).
- Megatron-Bridge 25.x rows: cuDNN fused attention (TE 2.x on Hopper); NeMo 24.x rows: FlashAttention-2.
- NeMo 24.x rows: bf16 gradients and 16-bit master-weight remainders (NeMo 1.x distributed Adam).
- NeMo 25.02 - 25.07 rows (NeMo 2.x's own performance scripts): what those scripts set, `nemo2_script_settings`
  (cuDNN attention, bf16 gradients, fused cross entropy and FP8 current scaling from 25.04, MoE token drop,
  DeepSeek-V3's stages without MTP, Llama 4 as CUDA graphs).
- TP > 1 runs overlap TP communication with GEMMs (the recipes' `tp_comm_overlap`), except where a MoE
  script turns it off (`MOE_SCRIPT_SETTINGS`).
- notes naming DeepEP: the run dispatched tokens with DeepEP's fused kernels.
- notes "tokendrop"/"token-drop" (not "token-dropless") = capacity factor 1 with padding, else dropless; "force-balanced" =
  balanced routing.

Where the release's own scripts ran something else than its table prints, the row still runs as printed
(the check asks for the published layout; `as_run_plan` gives the layout as run, SCRIPT_RAN_OTHERWISE).
Read in Megatron-Bridge's history (r0.1.0 = 25.09, tag v0.2.0 = 25.11, scripts/performance):
- Qwen3-30B-A3B H100: both scripts run VP 12, the tables print 24; the 25.11 script runs micro-batch 1
  (commit 8aed9a229 replaced micro_batch_size=2 with moe_a2a_overlap=True), the table prints 2. Its
  maintainers record the 25.11 row as a 2x regression of dropless against 25.09's token drop
  (Megatron-Bridge issue #1998). Dropless all-to-all dispatch makes the host wait once per MoE layer and
  micro-batch forward for the token counts (Megatron-Core MoEAlltoAllTokenDispatcher, cuda_sync_point
  "before_ep_alltoall"); token drop with padding never does.
- GPT-OSS-120B H100 (25.11): the script runs micro-batch 1 (the table's 4 with GA 2 is the B200 row's), and
  sets recompute_modules without recompute_granularity = "selective", so nothing is recomputed in v0.2.0.
- NeMo 24.07 fine-tuning rows: the table prints no VP or sequence-parallel column; the launch scripts' values
  fill them (`FINETUNE_SCRIPT_LAYOUTS`: 13B SFT VP 10, 70B SFT VP 20, 70B LoRA without SP).
- MoE rows of Megatron-Bridge releases take the token dispatcher (all-to-all, DeepEP, HybridEP), the EP
  all-to-all overlap and the TP communication overlap their release's H100 scripts set
  (`MOE_SCRIPT_SETTINGS`), as they ran.
- Qwen3-30B-A3B H100 26.02.01: the table prints PP2 VP12 EP8, the v0.3.1 script runs PP1 EP16 (PR #2477;
  the row's figures match the 26.04 PP1 EP16 row); it runs as printed.
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chakra_schema.errors import TraceInputError, brief
from estimators.model_config import (MEGATRON_BRIDGE_FIRST, ModelConfig, load_model, megatron_bridge_release,
                                     nemo_release_version)
from estimators.parallelism.plan import ParallelPlan, mtp_layers

# NeMo 24.07 LoRA recipes (NeMo docs, "Performance" LoRA rows): adapters of rank 16 on the fused QKV
# projection only (`target_modules: [attention_qkv]`, peft `adapter_dim: 16`)
LORA_RANK = 16
# "tokendrop", "token-drop", "token drop" -- but not "token-dropless", which the Megatron-Bridge tables'
# footnotes print for the dropless runs
_TOKEN_DROP = re.compile(r"token[- ]?drop(?!less)")
SQUAD_EXAMPLE_TOKENS = 256        # mean packed SQuAD example, Llama-2 tokens (see row_plan)
# What the H100 performance scripts of each Megatron-Bridge release set for its MoE rows in the columns the
# tables do not print: the token dispatcher, the EP all-to-all overlap (Megatron-Core
# overlap_moe_expert_parallel_comm with delay_wgrad_compute; Bridge `moe_a2a_overlap`) and the TP
# communication overlap. Containers map to Bridge tags by docs/releases/software-versions.md and
# docs/versions1.json: 25.09 = v0.1.0rc3, 25.11 = v0.2.0, 26.02 = v0.3.0, 26.02.01 = v0.3.1, 26.04 = v0.4.0,
# 26.04.01 = v0.4.2, 26.06 = v0.5.0. Read at those tags in scripts/performance (run_script.py and the yaml
# configs at v0.1.0rc3; configs/{qwen,qwen3,gpt_oss,deepseek}/*workload_base_configs.py, *_llm_pretrain.py and
# utils/overrides.py later):
# - DeepSeek-V3 25.09: DeepEP (enable_deepep on H100), a2a overlap, recipe CommOverlapConfig(tp_comm_overlap=False);
# - Qwen3 25.09: alltoall (asserted by apply_moe_token_drop), no a2a overlap; 235B keeps TP overlap;
# - Qwen3 25.11: a2a overlap on both; 235B's preset is built with tp_comm_overlap=False (kept through 26.04.01);
# - Qwen3-30B 26.02: flex dispatcher with the DeepEP backend, a2a overlap; 26.02.01 on (PR #2477): flex with
#   HybridEP (32 SMs), no a2a overlap;
# - Qwen3-235B 26.x: alltoall (set explicitly), a2a overlap; GPT-OSS-120B every release: alltoall, no overlap.
# Each entry: (moe_a2a, moe_a2a_overlap, tp_comm_overlap or None = the TP > 1 default).
_QWEN3_235B_26 = ("alltoall", True, False)
MOE_SCRIPT_SETTINGS: dict[tuple[str, str], tuple[str, bool, bool | None]] = {
    ("NeMo 25.09", "deepseek-v3"): ("deepep", True, False),
    ("NeMo 25.09", "qwen3-30b-a3b"): ("alltoall", False, None),
    ("NeMo 25.09", "qwen3-235b-a22b"): ("alltoall", False, None),
    ("NeMo 25.11", "qwen3-30b-a3b"): ("alltoall", True, None),
    ("NeMo 25.11", "qwen3-235b-a22b"): ("alltoall", True, False),
    ("NeMo 26.02", "qwen3-30b-a3b"): ("deepep", True, None),
    **{(rel, "qwen3-235b-a22b"): _QWEN3_235B_26 for rel in ("NeMo 26.02", "NeMo 26.02.01", "NeMo 26.04",
                                                          "NeMo 26.04.01")},
    **{(rel, "qwen3-30b-a3b"): ("hybridep", False, None) for rel in ("NeMo 26.02.01", "NeMo 26.04",
                                                                    "NeMo 26.04.01", "NeMo 26.06")},
    **{(rel, "gpt-oss-120b"): ("alltoall", False, None) for rel in ("NeMo 25.11", "NeMo 26.02", "NeMo 26.02.01",
                                                                   "NeMo 26.04", "NeMo 26.04.01")},
}
# NeMo 24.07's fine-tuning table prints no VP and no sequence-parallel column. The launch scripts that made
# it (NeMo-Framework-Launcher tag 24.07, examples/peft/llama/h100/*.sh over launcher_scripts/conf/peft/llama/
# sft.yaml, whose defaults are no VP and sequence_parallel False) set, by (task, model):
# - 13b_1node.sh (SFT, TP1 PP4): virtual_pipeline_model_parallel_size=10, overlap_p2p_comm=true;
# - 70b_2node.sh (SFT, TP4 PP4): virtual_pipeline_model_parallel_size=20, sequence_parallel=true,
#   ub_tp_comm_overlap=true;
# - 70b_1node_lora.sh (LoRA, TP2 PP4): ub_tp_comm_overlap=true but not sequence_parallel, and NeMo switches
#   userbuffer overlap off without SP (megatron_base_model.py: "Pipelined tensor-parallel communication
#   overlap is available with sequence-parallelism. Setting `ub_tp_comm_overlap` to False."), so that run
#   all-reduced its TP activations unpipelined;
# - the 7B SFT / LoRA and 13B LoRA scripts run TP1 PP1 (nothing to add).
# These fill columns the table leaves out; no printed column is changed.
FINETUNE_SCRIPT_LAYOUTS: dict[tuple[str, str], dict[str, Any]] = {
    ("sft", "llama2-13b"): {"vp": 10},
    ("sft", "llama2-70b"): {"vp": 20, "sequence_parallel": True},
    ("lora", "llama2-70b"): {"sequence_parallel": False},
}
FINETUNE_SCRIPT_RELEASE = "NeMo 24.07"
# Zoo names of the CSV's model names where they differ (NeMo 24.07's "Nemotron-340B" is Nemotron-4 340B;
# Llama 3.1 405B has Llama 3 405B's architecture, its longer RoPE context aside)
# the tables' names for zoo models ("Nemotron-15B" is Nemotron-4 15B in NeMo 25.x's tables: their TFLOP/s over
# tokens/s is its FLOP count; NeMo 25.x names Llama 4's language model "LLAMA4-Scout-LLM" / "LLAMA4-Maverick-LLM")
ALIASES = {"nemotron340b": "nemotron4-340b", "llama31405b": "llama3-405b", "nemotron15b": "nemotron4-15b",
           "llama4scoutllm": "llama4-scout", "llama4maverickllm": "llama4-maverick"}


@dataclass
class PublishedRow:
    index: int
    source: str
    release: str
    model_name: str
    gpu: str
    gpus: int
    precision: str
    tp: int
    pp: int
    cp: int
    vp: int
    ep: int
    etp: int
    mbs: int
    gbs: int
    seq: int
    recompute: str
    fsdp: int
    tflops: float | None
    tokens_per_gpu: float | None
    notes: str
    raw: dict[str, str] = field(default_factory=dict)

    @property
    def container(self) -> str:
        """The release without the table revision it was read at ("NeMo 24.07 (rev 9c5c5e9709)" -> "NeMo 24.07")."""
        return self.release.split(" (")[0]

    @property
    def label(self) -> str:
        return f"{self.container} {self.model_name} {self.gpus}x{self.gpu or 'H100'} seq{self.seq}"

    @property
    def h100(self) -> bool:
        """The row names an H100 (or no GPU: the published record is H100's)."""
        return not self.gpu or "H100" in self.gpu.upper()


NOT_APPLICABLE_OK = ("vp", "cp", "ep", "etp")     # columns whose 'n/a' means "none": the default


class _Cells:
    """Typed reads of one CSV row's cells: a malformed cell is bad input naming the file, row and column."""

    def __init__(self, path: Path, index: int, raw: dict[str, str]) -> None:
        self.path, self.index, self.raw = path, index, raw

    def _bad(self, col: str, what: str) -> TraceInputError:
        return TraceInputError(self.path, f"row {self.index}: {col} {brief(str(self.raw.get(col)))} is not {what}")

    def int(self, col: str, default: int, minimum: int = 1) -> int:
        """A whole number >= minimum, optionally followed by a note in parentheses ('1 (inferred)');
        `default` when the cell is empty, or 'n/a' in a column that may be not applicable (the Megatron-Bridge
        tables print a VP, CP, EP or ETP of none so; a GPU count or batch is never not applicable)."""
        v = (self.raw.get(col) or "").strip()
        if not v or (v.lower() in ("n/a", "na") and col in NOT_APPLICABLE_OK):
            return default
        m = re.fullmatch(r"(\d{1,18})\s*(\(.*\))?", v)     # 18 digits: no 5,000-digit int to parse
        if not m or int(m.group(1)) < minimum:
            raise self._bad(col, f"a whole number >= {minimum} (at most 18 digits)")
        return int(m.group(1))

    def figure(self, col: str) -> float | None:
        """A published figure: a finite number > 0, None when the cell is empty."""
        v = (self.raw.get(col) or "").strip()
        if not v:
            return None
        try:
            x = float(v)
        except ValueError:
            raise self._bad(col, "a number") from None
        if not math.isfinite(x) or x <= 0:
            raise self._bad(col, "a finite number > 0")
        return x


def read_rows(path: str | Path) -> list[PublishedRow]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TraceInputError(p, f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TraceInputError(p, f"not UTF-8 text (byte {e.start})") from None
    try:
        return _rows(p, csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))
    except csv.Error as e:
        raise TraceInputError(p, f"malformed CSV: {e}") from None


def _rows(p: Path, reader: csv.DictReader) -> list[PublishedRow]:
    rows = []
    need = {"model", "gpus", "tp", "pp", "gbs", "seq", "precision"}
    if not need <= set(reader.fieldnames or ()):
        raise TraceInputError(p, f"missing columns {sorted(need - set(reader.fieldnames or ()))}")
    for i, r in enumerate(reader):
        c = _Cells(p, i, r)
        rows.append(PublishedRow(
            index=i, source=r.get("source") or "", release=r.get("release") or "", model_name=r["model"] or "",
            gpu=(r.get("gpu") or "").strip(), gpus=c.int("gpus", 1), precision=(r["precision"] or "").strip(),
            tp=c.int("tp", 1), pp=c.int("pp", 1), cp=c.int("cp", 1), vp=c.int("vp", 1),
            ep=c.int("ep", 1), etp=c.int("etp", 1), mbs=c.int("mbs", 1),
            gbs=c.int("gbs", 1), seq=c.int("seq", 2048), recompute=(r.get("recompute") or "").strip(),
            fsdp=c.int("fsdp", 0, minimum=0), tflops=c.figure("published_tflops"),
            tokens_per_gpu=c.figure("published_tokens_per_gpu"), notes=r.get("notes", "") or "", raw=r))
    return rows


# ------------------------------------------------------------------------------ model names
def zoo_name(model_name: str) -> str:
    """'LLAMA2-7B SFT' -> 'llama2-7b', 'DeepSeekV3 (dropless)' -> 'deepseek-v3', 'Qwen3_30B_a3B' ->
    'qwen3-30b-a3b', 'GPT OSS 120B' -> 'gpt-oss-120b' (load_model ignores case and punctuation)."""
    s = re.sub(r"\(.*?\)", "", model_name)
    s = re.sub(r"\b(SFT|LoRA)\b", "", s, flags=re.I).strip()
    return ALIASES.get("".join(c for c in s.lower() if c.isalnum()), s)


def row_model(row: PublishedRow) -> ModelConfig:
    model = load_model(zoo_name(row.model_name))
    if nemo2_release(row) and mtp_layers(model):
        # NeMo 2.x builds DeepSeek-V3 without its MTP module (DeepSeekV3Config.mtp_num_layers = None)
        model = replace(model, mtp_layers=0)
    return model


def _finetune(row: PublishedRow) -> str:
    text = f"{row.release} {row.model_name}"
    if re.search(r"\bLoRA\b", text, re.I):
        return "lora"
    if re.search(r"\bSFT\b", text):
        return "sft"
    return "none"


# FP8 recipe names a precision cell may print (spaces, dashes and underscores alike)
FP8_RECIPE_CELLS = {"FP8-CS": "tensorwise", "FP8-TENSORWISE": "tensorwise", "FP8-DS": "delayed",
                    "FP8-DELAYED": "delayed", "FP8-MX": "mxfp8", "MXFP8": "mxfp8", "FP8-BLOCKWISE": "blockwise",
                    "FP8-BLOCK": "blockwise", "FP8-BLOCK-SCALED": "blockwise"}


def row_precision(row: PublishedRow) -> tuple[str, str]:
    """(GEMM precision, FP8 recipe) of the row's precision cell. "BF16" and "FP16" run at the 16-bit tensor
    rate; "FP8-CS" is current (tensorwise) scaling, "FP8-DS" delayed scaling, "FP8-MX" / "MXFP8" Blackwell's
    MX block scaling, "FP8 blockwise" / "block-scaled" DeepSeek-style 1x128 / 128x128 scales; a plain "FP8"
    (or an empty cell) is the recipe the row's release used by default (`_default_fp8_recipe`). A cell
    printing two precisions for two figures ("FP8-CS (FP8-MX)") is read by its first, to which the first
    figures belong; a plain "FP8" qualified in parentheses ("FP8 (tensorwise)", "FP8 (MX)") by its recipe.
    FP4 formats and anything else are bad input for the row: no GEMM model here prices them."""
    def norm(text: str) -> str:
        return re.sub(r"[\s_-]+", "-", text.strip().upper()).strip("-")

    def recipe_of(p: str) -> str | None:
        return FP8_RECIPE_CELLS.get(p) or FP8_RECIPE_CELLS.get("FP8-" + p)

    outside = norm(re.sub(r"\(.*?\)", "", row.precision))
    inside = [norm(x) for x in re.findall(r"\((.*?)\)", row.precision)]
    if not outside and inside:          # "(FP8-MX)": the parentheses are all there is
        outside, inside = inside[0], inside[1:]
    if outside in ("BF16", "FP16"):
        return "bf16", "delayed"
    if outside in ("", "FP8"):
        qualified = next((r for r in map(recipe_of, inside) if r), None)
        return "fp8", qualified or _default_fp8_recipe(row)
    recipe = recipe_of(outside)
    if recipe is None:
        raise TraceInputError(None, f"row {row.index}: precision {row.precision!r} is not one this model "
                                    "prices (BF16, FP16, FP8, FP8-CS, FP8-DS, FP8-MX / MXFP8, FP8 blockwise)")
    return "fp8", recipe


def _default_fp8_recipe(row: PublishedRow) -> str:
    """The FP8 recipe of a row printed as plain "FP8": its release's default."""
    # Megatron-Bridge (25.09+) performance recipes train FP8 with current scaling, and so did NeMo 25.04 and
    # 25.07 (their performance summaries: "per-tensor FP8 quantization, leveraging scaling factors computed in
    # the current step"); NeMo 25.02's scripts default to delayed scaling (--fp8_recipe ds)
    v = nemo2_release(row)
    if megatron_bridge_release(row.release) or (v is not None and v >= (25, 4)):
        return "tensorwise"
    return "delayed"


# NeMo 2.x's own performance scripts (NVIDIA/NeMo scripts/llm/performance at v2.2.0 = NeMo 25.02,
# scripts/performance at v2.3.0 = 25.04 and v2.4.0 = 25.07), before Megatron-Bridge took them over
NEMO2_SCRIPTS = ((25, 2), MEGATRON_BRIDGE_FIRST)
# DeepSeek-V3's pipeline layout in NeMo 25.07's script (pretrain_deepseek_v3.py at v2.4.0, map_pp_vp_to_layout):
# transformer layers per chunk by (pp, vp); 25.04's (v2.3.0) gives the first stage 64 / pp - 1 layers and the
# last 64 / pp - 2 instead
DEEPSEEK_V3_NEMO_2507_LAYOUT = {
    (4, 1): (16, 16, 16, 13),
    (8, 1): (8,) * 7 + (5,), (4, 2): (8,) * 7 + (5,),
    (16, 1): (4,) * 15 + (1,), (8, 2): (4,) * 15 + (1,), (4, 4): (4,) * 15 + (1,),
}


def nemo2_release(row: PublishedRow) -> tuple[int, int] | None:
    """The row's NeMo version when its table comes from NeMo 2.x's own performance scripts (25.02 - 25.07)."""
    v = nemo_release_version(row.release)
    return v if v is not None and NEMO2_SCRIPTS[0] <= v < NEMO2_SCRIPTS[1] else None


def nemo2_script_settings(row: PublishedRow, precision: str, model: ModelConfig) -> dict[str, Any]:
    """What NeMo 2.x's performance scripts set that the tables do not print (empty for other releases):
    - cuDNN fused attention: the executors export NVTE_FUSED_ATTN=1 and NVTE_FLASH_ATTN=1, and Transformer
      Engine prefers FusedAttention over FlashAttention on Hopper when both are enabled;
    - bf16 gradient reduction (`grad_reduce_in_fp32 = False`): for FP8 runs in 25.02 and 25.04, for every run
      in 25.07 (helpers.set_precision_configs);
    - Transformer Engine's fused cross entropy (`cross_entropy_fusion_impl = "te"`) from 25.04 on;
    - MoE pre-training with token drop, capacity factor 1 padded (MegatronTokenDropCallback: the Mixtral and
      Llama 4 recipes' performance mode, the DeepSeek-V3 and Qwen3 scripts), except DeepSeek-V3 on H100 in
      25.07, which dispatches dropless with DeepEP (pretrain_deepseek_v3.py at v2.4.0); a row whose name or
      notes say "dropless" stays dropless, one saying "token drop" drops tokens;
    - Llama 4 on H100 with its layers as CUDA graphs (the H100 configs' cuda_graphs column, 25.04 and 25.07);
    - DeepSeek-V3's uneven pipeline stages as the scripts lay them out (DEEPSEEK_V3_NEMO_2507_LAYOUT), and
      without its MTP module (`row_model`)."""
    v = nemo2_release(row)
    if v is None:
        return {}
    kw: dict[str, Any] = {"attention_kernel": "cudnn"}
    if precision == "fp8" or v >= (25, 7):
        kw["grad_bytes"] = 2
    if v >= (25, 4):
        kw["fused_cross_entropy"] = True
    text = f"{row.model_name} {row.notes}".lower()
    if model.moe is not None and _finetune(row) == "none" and "dropless" not in text:   # a row saying so keeps it
        if model.name == "deepseek-v3" and v >= (25, 7) and row.h100 and not _TOKEN_DROP.search(text):
            kw["moe_a2a"] = "deepep"
        else:
            kw["moe_capacity_factor"] = 1.0
    if model.name.startswith("llama4") and v >= (25, 4) and row.h100:
        kw["cuda_graphs"] = True     # recommended_model_configs/model_configs_h100.csv: cuda_graphs 1 (Llama 4)
    if model.name == "deepseek-v3":
        if v >= (25, 7) and (row.pp, row.vp) in DEEPSEEK_V3_NEMO_2507_LAYOUT:
            kw["pipeline_layout"] = DEEPSEEK_V3_NEMO_2507_LAYOUT[row.pp, row.vp]
        elif v < (25, 7) and row.vp == 1 and row.pp in (2, 4, 8, 16):
            # 25.04 sets the first / last pipeline stage's layers for any VP; only without VP are they chunks here
            kw.update(first_stage_layers=64 // row.pp - 1, last_stage_layers=64 // row.pp - 2)
    return kw


def _recompute(row: PublishedRow) -> dict[str, Any]:
    r = row.recompute.lower()
    if not r:
        return {}
    if r.startswith("full"):
        n = re.search(r"(\d+)\s*layers?", r)
        return {"recompute": "full", "recompute_layers": int(n.group(1)) if n else 0}
    if r.startswith("selective"):
        mods = re.search(r"\((.*?)\)", r)
        names = tuple(x.strip() for x in mods.group(1).split(",")) if mods else ()
        return {"recompute": "selective", "recompute_modules": names}
    raise TraceInputError(None, f"row {row.index}: unknown recompute {row.recompute!r}")


def finetune_script_layout(row: PublishedRow, model: ModelConfig) -> dict[str, Any]:
    """What the release's fine-tuning launch script set in the columns its table does not print
    (`FINETUNE_SCRIPT_LAYOUTS`, its H100 scripts); empty for every other row."""
    ft = _finetune(row)
    if ft == "none" or not row.release.startswith(FINETUNE_SCRIPT_RELEASE) or not row.h100:
        return {}
    return dict(FINETUNE_SCRIPT_LAYOUTS.get((ft, model.name), {}))


def moe_script_settings(row: PublishedRow, model_name: str) -> tuple[str, bool, bool | None] | None:
    """(dispatcher, EP all-to-all overlap, TP overlap or None) the row's release scripts set for this MoE
    model (`MOE_SCRIPT_SETTINGS`), None when the table has no such entry. Those entries are the H100
    scripts' (other GPUs' presets set other dispatchers, overlaps and CUDA graphs): a row on another GPU
    gets none of them."""
    if not row.h100:
        return None
    return MOE_SCRIPT_SETTINGS.get((row.container, model_name))


def row_plan(row: PublishedRow, model: ModelConfig) -> ParallelPlan:
    """The published layout as a plan (nothing changed)."""
    dp = row.gpus // (row.tp * row.pp * row.cp)
    if dp * row.tp * row.pp * row.cp != row.gpus:
        raise TraceInputError(None, f"row {row.index}: gpus {row.gpus} is not a multiple of tp*pp*cp")
    prec, fp8_recipe = row_precision(row)
    kw: dict[str, Any] = dict(tp=row.tp, pp=row.pp, cp=row.cp, dp=dp, vp=row.vp, ep=row.ep, etp=row.etp,
                              seq_len=row.seq, global_batch=row.gbs, micro_batch=row.mbs, precision=prec,
                              fp8_recipe=fp8_recipe)
    # NeMo / Megatron-Bridge H100 performance recipes pipeline the sequence-parallel all-gathers and
    # reduce-scatters with the GEMMs (TE userbuffers, `tp_comm_overlap=True`) whenever TP > 1
    kw["tp_comm_overlap"] = row.tp > 1
    if megatron_bridge_release(row.release):
        # Megatron-Bridge 25.x (Transformer Engine 2.x, cuDNN 9) runs cuDNN's fused flash attention on Hopper
        kw["attention_kernel"] = "cudnn"
        # its performance scripts (scripts/performance, 25.11 tree 97ad8cc6f: configs/*/..._llm_pretrain.py
        # `ddp.grad_reduce_in_fp32 = False`; utils/overrides.py `cross_entropy_fusion_impl = "te"`) keep
        # bf16 gradient buffers, reduce gradients in bf16, and run TE's fused cross entropy
        kw.update(grad_bytes=2, fused_cross_entropy=True)
    kw.update(nemo2_script_settings(row, prec, model))
    if row.release.startswith("NeMo 24."):
        # NeMo 1.x (megatron_amp_O2 + distributed_fused_adam): bf16 gradients, fp32 masters kept as 16-bit
        # remainders of the bf16 weights (NeMo megatron_base_model.setup_optimization:
        # store_param_remainders=True for fp32 optimizer states over a bf16 model)
        kw.update(grad_bytes=2, master_weight_bytes=2)
    kw.update(_recompute(row))
    if row.fsdp:
        kw.update(zero=3, dp_shard=row.fsdp if row.fsdp < dp else 0, fsdp="megatron")
    ft = _finetune(row)
    kw["finetune"] = ft
    # packed SFT / LoRA sequences: NeMo 24.07's fine-tuning recipes pack SQuAD examples into the sequence
    # with their boundaries (cu_seqlens), so attention runs per example, not over the pack. SQuAD v1.1
    # (Rajpurkar et al. 2016) contexts average about 120-140 words; with the question, the answer and
    # NeMo's prompt template an example is about 200-300 Llama-2 tokens. With flash attention priced in
    # 128-row tiles the estimate moves 1.6-2.8% between 192 and 384 and is fastest at 256, which fills its
    # tiles exactly: examples of varied length fill their last tile half on average, so one mean length
    # leans optimistic. NeMo's published TFLOP/s for these rows count no attention at all (test_model_configs).
    if ft != "none":
        kw["packed_doc_len"] = SQUAD_EXAMPLE_TOKENS
    if ft == "lora":
        kw["lora_rank"] = LORA_RANK
    kw.update(finetune_script_layout(row, model))
    text = f"{row.model_name} {row.notes}".lower()
    if model.moe is not None:
        if _TOKEN_DROP.search(text):
            kw["moe_capacity_factor"] = 1.0
        if "deepep" in text:      # the run dispatched with DeepEP (the notes name it)
            kw["moe_a2a"] = "deepep"
        # Megatron-Bridge 25.x dropless runs force-balance the router (25.11 tables' footnote; v0.2.0
        # scripts/performance set_qwen3_common_configs: moe_router_force_load_balancing = True, "required for
        # token dropless"; the GPT-OSS and DeepSeek scripts set it too). The 25.09 token-drop runs leave it
        # off, which padding to capacity makes moot: every expert computes its capacity either way.
        kw["moe_force_balance"] = "force-balanced" in text or "force balanced" in text or \
            kw.get("moe_capacity_factor", 0) > 0 or megatron_bridge_release(row.release)
        script = moe_script_settings(row, model.name)
        if script is not None:
            kw["moe_a2a"], kw["moe_a2a_overlap"] = script[0], script[1]
            if script[2] is not None:
                kw["tp_comm_overlap"] = script[2] and row.tp > 1
    return ParallelPlan(**kw)


def row_scenario(row: PublishedRow) -> tuple[ModelConfig, ParallelPlan]:
    model = row_model(row)
    return model, row_plan(row, model)


# Printed columns that the release's own H100 script set otherwise (read at its Megatron-Bridge tag; the
# module docstring gives the commits). The check runs every row as printed; `as_run_plan` is the plan as
# the script ran it, which `benchmarks/published_training.py --as-run` reports beside the printed one.
SCRIPT_RAN_OTHERWISE: dict[tuple[str, str], dict[str, Any]] = {
    ("NeMo 25.09", "qwen3-30b-a3b"): {"vp": 12},
    ("NeMo 25.11", "qwen3-30b-a3b"): {"vp": 12, "micro_batch": 1},
    ("NeMo 25.11", "gpt-oss-120b"): {"micro_batch": 1, "recompute": "none", "recompute_modules": ()},
    ("NeMo 26.02.01", "qwen3-30b-a3b"): {"pp": 1, "vp": 1, "ep": 16},
}


def script_ran_otherwise(row: PublishedRow, model_name: str) -> dict[str, Any]:
    """The printed columns the row's release's H100 script set otherwise, as plan fields
    (SCRIPT_RAN_OTHERWISE; empty when it ran what the table prints, and for rows on other GPUs)."""
    if not row.h100:
        return {}
    return SCRIPT_RAN_OTHERWISE.get((row.container, model_name), {})


def as_run_plan(row: PublishedRow, model: ModelConfig) -> ParallelPlan | None:
    """The row's plan with the columns its release's script set otherwise (SCRIPT_RAN_OTHERWISE); None
    when the script ran what the table prints."""
    changes = script_ran_otherwise(row, model.name)
    if not changes:
        return None
    plan = row_plan(row, model)
    pp = changes.get("pp", plan.pp)
    return plan.with_(**changes, dp=plan.gpus // (plan.tp * pp * plan.cp))


# ------------------------------------------------------------------------------ running rows
@dataclass
class RowResult:
    row: PublishedRow
    predicted_tokens_per_gpu: float = math.nan
    predicted_tflops: float = math.nan
    memory_gib: float = math.nan
    oom: bool = False
    error: str | None = None      # why it could not run
    wall_s: float = 0.0
    plan: ParallelPlan | None = None   # the plan that ran (None when the row could not run)
    model: str = ""                    # the zoo model that ran

    @property
    def metric(self) -> str:
        return "tokens/s/GPU" if self.row.tokens_per_gpu else "TFLOP/s/GPU"

    @property
    def relative_error(self) -> float | None:
        if self.error:
            return None
        if self.row.tokens_per_gpu:
            return self.predicted_tokens_per_gpu / self.row.tokens_per_gpu - 1.0
        if self.row.tflops:
            return self.predicted_tflops / self.row.tflops - 1.0
        return None

    def to_json(self) -> dict[str, Any]:
        r = self.row
        return {"row": r.index, "label": r.label, "model": r.model_name, "release": r.release, "gpus": r.gpus,
                "published_tokens_per_gpu": r.tokens_per_gpu, "published_tflops": r.tflops,
                "predicted_tokens_per_gpu": self.predicted_tokens_per_gpu,
                "predicted_tflops": self.predicted_tflops, "metric": self.metric,
                "error": self.relative_error, "memory_gib": self.memory_gib, "oom": self.oom,
                "failure": self.error, "wall_s": self.wall_s}


def release_tflops(row: PublishedRow, model: ModelConfig, tokens_per_gpu: float, default: float,
                   plan: Any = None) -> float:
    """Model TFLOP/s per GPU as the row's release counts them (estimators.model_config
    RELEASE_FLOP_CONVENTION: NeMo's own tables up to 25.07 full-square attention, Megatron-Bridge's causal
    half), so that rows publishing only TFLOP/s compare like with like; fine-tuning rows with the plan's
    packed documents and LoRA's frozen weights, as the conventions take them."""
    try:
        from estimators.model_config import FLOP_CONVENTIONS, release_flop_convention
        conv = FLOP_CONVENTIONS[release_flop_convention(row.release)]
    except (ImportError, TraceInputError, KeyError):
        return default
    finetune = getattr(plan, "finetune", "none")
    docs = getattr(plan, "packed_doc_len", 0) if finetune != "none" else 0
    if docs and release_flop_convention(row.release) == "nemo-24.07":
        docs = 1e-9   # NeMo 24.07 counts its packed fine-tuning rows without attention (test_model_configs)
    return conv(model, row.seq, attention_seq=docs or None, frozen=finetune == "lora") * tokens_per_gpu / 1e12


def row_hardware(row: PublishedRow, hardware: Any):
    """The hardware the row ran on. Its GPU column is read as a preset name or alias ("H100", "DGX-B200",
    "h200") or, failing that, by the presets' device names, the longest match winning ("H100 SXM5 80GB" ->
    h100-sxm, "A100 80GB" -> a100-sxm-80gb). `hardware` (the case's, possibly a user's own preset) is kept
    when the column is empty or names its GPU at least as specifically; a GPU that no preset describes is an
    error for the row, not a prediction on another GPU."""
    from estimators.parallelism.timing import resolve_hardware
    from replay.hardware.config import get_hardware, guess_hardware, list_hardware
    base = resolve_hardware(hardware)
    name = row.gpu.strip()
    if not name:
        return base

    def match(hw) -> int:   # the longest of its device names the column holds as a word ("GB200" is no B200)
        return max((len(d) for d in hw.gpu.device_names
                    if re.search(rf"(?<![A-Z0-9]){re.escape(d.upper())}(?![0-9])", name.upper())), default=0)
    try:
        named = get_hardware(name.lower().replace(" ", "-"))
    except TraceInputError:
        named = guess_hardware(name)
        named = named if named is not None and match(named) else None
    if named is None:
        raise TraceInputError(None, f"no hardware preset for the row's GPU {name!r} "
                                    f"(presets: {', '.join(list_hardware())})")
    if named.name == base.name or 0 < max(match(named), 1) <= match(base):
        return base
    return resolve_hardware(named)


def run_row(row: PublishedRow, hardware: Any = "h100-sxm", as_run: bool = False) -> RowResult:
    """The row predicted with its printed layout (`as_run`: as its release's script ran it, where that
    differs: SCRIPT_RAN_OTHERWISE), on the GPU its row names (`row_hardware`)."""
    import time

    from estimators.parallelism.evaluate import predict
    t0 = time.perf_counter()
    try:
        hardware = row_hardware(row, hardware)
        model, plan = row_scenario(row)
        if as_run:
            plan = as_run_plan(row, model) or plan
        p = predict(model, plan, hardware)
    except TraceInputError as e:
        return RowResult(row, error=str(e.problem if hasattr(e, "problem") else e),
                         wall_s=time.perf_counter() - t0)
    tok_gpu = p.tokens_per_s / plan.gpus
    return RowResult(row, plan=plan, model=model.name, predicted_tokens_per_gpu=tok_gpu,
                     predicted_tflops=release_tflops(row, model, tok_gpu, p.tflops_per_gpu, plan),
                     memory_gib=p.memory.total_gib, oom=p.oom, wall_s=time.perf_counter() - t0)


def run_rows(path: str | Path, hardware: str = "h100-sxm", only: list[int] | None = None,
             progress=None) -> list[RowResult]:
    return run_selected_rows(read_rows(path), hardware, only, progress)


def run_selected_rows(rows: list[PublishedRow], hardware: Any = "h100-sxm", only: list[int] | None = None,
                      progress=None) -> list[RowResult]:
    """`rows` (those whose index is in `only`, when given) predicted on `hardware`."""
    out = []
    for n, row in enumerate(rows):
        if only is not None and row.index not in only:
            continue
        out.append(run_row(row, hardware))
        if progress:
            progress(n + 1, len(rows))
    return out


# ------------------------------------------------------------------------------ `lumos-sim check` case kind
def case_from_table(path, where: str, raw: dict, shared, CaseSpec, fraction, typed, ranks_of):
    """A `[[case]]` with `kind = "published_training"`: `csv` (may use {shared}), `tolerance` (max
    |error| of any row), `mean_tolerance`, optional `rows` (row indices), `hardware`."""
    import os

    if raw.get("kind") != "published_training":
        raise TraceInputError(path, f"'kind' of {where} must be 'replay' or 'published_training', "
                                    f"got {raw.get('kind')!r}")
    if "name" not in raw or "csv" not in raw:
        raise TraceInputError(path, f"{where} (published_training) needs 'name' and 'csv'")
    replay_only = sorted(set(raw) & {"inputs", "et", "kineto", "timing", "source_hardware", "measured_ms", "steps",
                                      "ranks"})
    if replay_only:
        raise TraceInputError(path, f"'{replay_only[0]}' of {where} applies to replay cases, not published_training "
                                    "(which takes csv, rows, hardware, tolerance, mean_tolerance)")
    name = typed(path, f"'name' of {where}", raw["name"], str)
    csv_path = typed(path, f"'csv' of case '{name}'", raw["csv"], str)
    if "{shared}" in csv_path:
        if shared is None:
            raise TraceInputError(path, f"case '{name}' needs the shared data folder: set LUMOS_SIM_SHARED")
        csv_path = csv_path.replace("{shared}", str(shared))
    if not os.path.isabs(csv_path):
        csv_path = str(Path(path).resolve().parent / csv_path)
    return CaseSpec(name=name, inputs=[], kind="published_training", csv=csv_path,
                    hardware=typed(path, f"'hardware' of case '{name}'", raw.get("hardware", "h100-sxm"), str),
                    timing="model",
                    tolerance=fraction(path, f"'tolerance' of case '{name}'", raw.get("tolerance", 0.15)),
                    mean_tolerance=(fraction(path, f"'mean_tolerance' of case '{name}'", raw["mean_tolerance"])
                                    if "mean_tolerance" in raw else None),
                    ranks=ranks_of(path, f"'rows' of case '{name}'", raw["rows"]) if "rows" in raw else None,
                    description=raw.get("description", "") if isinstance(raw.get("description", ""), str) else "")


def run_case(suite: str, case, CaseResult, StepCheck):
    """Every row (or `case.ranks` = the chosen rows): one check per row, measured = the published
    tokens/s per GPU (TFLOP/s per GPU where the row has none), predicted = ours. A row that cannot run,
    or that the memory model flags as out of memory although it ran, fails the case; a case that cannot
    be read (no such CSV or preset, a row the table lacks) is bad input, raised with the case named."""
    import time

    from estimators.parallelism.timing import resolve_hardware

    t0 = time.perf_counter()
    try:
        rows = read_rows(case.csv)
        hardware = resolve_hardware(case.hardware or "h100-sxm")
        missing = sorted(set(case.ranks or ()) - {r.index for r in rows})
        if missing:
            raise TraceInputError(case.csv, f"'rows' names row {missing[0]}, which the table lacks "
                                            f"(rows 0-{len(rows) - 1})")
    except TraceInputError as e:
        raise TraceInputError(e.path, f"{e.problem} (case '{case.name}' of suite '{suite}')") from None
    results = run_selected_rows(rows, hardware, case.ranks)
    checks, problems = [], []
    for r in results:
        if r.error:
            problems.append(f"row {r.row.index} ({r.row.model_name}): {r.error}")
            continue
        if r.oom:
            problems.append(f"row {r.row.index} ({r.row.model_name}): flagged out of memory "
                            f"({r.memory_gib:.1f} GiB) but it ran")
        pub = r.row.tokens_per_gpu or r.row.tflops
        pred = r.predicted_tokens_per_gpu if r.row.tokens_per_gpu else r.predicted_tflops
        if pub:
            checks.append(StepCheck(r.row.index, f"{r.row.label} ({r.metric})", float(pub), float(pred)))
    err = "; ".join(problems) if problems else (None if checks else "no row with a published figure")
    return CaseResult(suite, case, checks, error=err, seconds=time.perf_counter() - t0)
