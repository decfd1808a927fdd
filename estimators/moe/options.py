"""`MoEOptions`: the scenario's `[moe]` section (`Scenario.moe`), owned by the MoE what-if: routing, placement,
phase and serving choices, checked on construction (one line per bad value)."""
from __future__ import annotations

from dataclasses import dataclass

from chakra_schema.errors import TraceInputError, brief, check_choice, check_number
from estimators.moe.overlap import OVERLAP_CHOICES
from estimators.moe.placement import PLACEMENTS, SLOTTED

PHASES = ("prefill", "decode", "train")
FITS = ("first-half", "prefill", "all")
GROUP_BY = ("none", "domain")
KV_DTYPES = ("bf16", "fp8")
OVERLAPS = OVERLAP_CHOICES


# Caps that keep one estimate bounded in time and memory (a typo such as 1e9 is refused, not run for hours).
MAX_TIMED_WINDOWS = 1024
MAX_SAMPLED_WINDOW = 1 << 24         # tokens per batch; the routing synthesizer's own cap
MAX_SYNTHETIC_TOKENS = 1 << 24
MAX_CONTEXT = 1 << 24                # tokens of a prompt / KV cache (16.7M)
MAX_TOKENS = 10 ** 24                # a bound for arithmetic only: what fits a GPU is checked against its memory
MAX_COUNT = 1 << 20                  # GPUs, expert slots, groups
MAX_DRAFT_TOKENS = 16                # speculative windows in use are 1-8 tokens


@dataclass(frozen=True)
class MoEOptions:
    routing: str = "synthetic"         # trace file / directory, or synthetic[:k=v,...]
    expert_load: str = ""              # [layers][experts] token counts (JSON or CSV) when only loads are known
    placement: str = "contiguous"
    redundant_experts: int = 0         # eplb: extra physical expert slots
    groups: int = 0                    # expert groups of node-limited routing (0: the model's, moe.groups)
    groups_per_token: int = 0          # groups a token's experts come from (0: the model's)
    group_by: str = "none"             # none | domain: batch requests of one domain together
    phase: str = "decode"              # prefill | decode | train
    tokens: int = 0                    # routed tokens per EP rank per forward (0: 4096 prefill, 128 decode)
    context: int = 4096                # inference: prompt / KV length for attention
    fit: str = "first-half"            # first-half | prefill | all
    fit_fraction: float = 0.5
    synthetic_tokens: int = 65536      # tokens of synthetic / load-sampled routing (at least 2 batches;
                                       # a tokens= in the synthetic spec wins)
    timed_windows: int = 4             # batches whose all-to-all and GEMMs are timed
    coactivation_weight: float = 0.1   # locality: weight of keeping co-activated experts on one node
    seed: int = 0
    attention_tp: int = 1              # inference: GPUs per attention group (1: attention data-parallel)
    overlap: str = "none"              # inference: none | dual-batch | dual-batch-ideal (estimators.moe.overlap)
    mtp_acceptance: float = 0.0        # decode: acceptance rate of each MTP draft token (0: no MTP)
    mtp_acceptance_length: float = 0.0  # decode: tokens a step emits per sequence, as published (instead of a rate)
    mtp_draft_tokens: int = 0          # decode: draft tokens per step (0: the model's MTP layers; more reuse the
                                       # last module, as SGLang's and TensorRT-LLM's MTP 3 do with DeepSeek's one)
    kv_dtype: str = "bf16"             # inference: KV-cache element type (fp8: an FP8 cache, 1 byte per element)
    sampled_window: int = 16384        # batches (EP x tokens) larger than this are costed on the expected
                                       # counts of the evaluated tokens' expert loads, not token by token

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise TraceInputError(None, f"moe.{msg}")
        for name, choices in (("placement", PLACEMENTS), ("phase", PHASES), ("fit", FITS), ("group_by", GROUP_BY),
                              ("overlap", OVERLAPS), ("kv_dtype", KV_DTYPES)):
            check_choice(f"moe.{name}", getattr(self, name), choices)
        for name in ("redundant_experts", "groups", "groups_per_token", "tokens"):
            if getattr(self, name) < 0:
                bad(f"{name} must be >= 0")
        for name in ("context", "synthetic_tokens", "timed_windows", "attention_tp", "sampled_window"):
            if getattr(self, name) < 1:
                bad(f"{name} must be >= 1")
        for name, cap, why in (("context", MAX_CONTEXT, "a KV cache / prompt length"),
                               ("tokens", MAX_TOKENS, "tokens per GPU in one forward"),
                               ("attention_tp", MAX_COUNT, "GPUs in an attention group"),
                               ("groups", MAX_COUNT, "expert groups"), ("groups_per_token", MAX_COUNT, "expert groups"),
                               ("timed_windows", MAX_TIMED_WINDOWS, "each is an event-level replay"),
                               ("sampled_window", MAX_SAMPLED_WINDOW, "a batch's routing is held in memory"),
                               ("synthetic_tokens", MAX_SYNTHETIC_TOKENS, "generated in memory")):
            if getattr(self, name) > cap:
                bad(f"{name} must be at most {cap:,} ({why}), got {brief(getattr(self, name))}")
        if not 0.0 < self.fit_fraction < 1.0:
            bad("fit_fraction must be in (0, 1)")
        check_number("moe.coactivation_weight", self.coactivation_weight, 0)   # finite: NaN / inf refused
        if self.seed < 0:   # numpy's SeedSequence takes non-negative integers only
            bad(f"seed must be >= 0, got {self.seed}")
        if not 0.0 <= self.mtp_acceptance <= 1.0:
            bad("mtp_acceptance must be in [0, 1]")
        check_number("moe.mtp_acceptance_length", self.mtp_acceptance_length, 0)
        if 0 < self.mtp_acceptance_length < 1:
            bad(f"mtp_acceptance_length counts the verified token too: at least 1, got {self.mtp_acceptance_length}")
        if self.mtp_acceptance and self.mtp_acceptance_length:
            bad("give mtp_acceptance (a rate per draft token) or mtp_acceptance_length (tokens per step), not both")
        if not 0 <= self.mtp_draft_tokens <= MAX_DRAFT_TOKENS:
            bad(f"mtp_draft_tokens must be in [0, {MAX_DRAFT_TOKENS}], got {brief(self.mtp_draft_tokens)}")
        if self.mtp_draft_tokens and not (self.mtp_acceptance or self.mtp_acceptance_length):
            bad("mtp_draft_tokens needs mtp_acceptance or mtp_acceptance_length (how many drafts are kept)")
        if self.redundant_experts and self.placement not in SLOTTED:
            bad("redundant_experts needs placement = eplb (or eplb-fallback)")
        if self.tokens and self.phase == "train":   # training tokens are micro-batch x seq-len: not silently dropped
            bad("tokens does not apply to phase train (a forward routes micro-batch x seq-len tokens per rank)")
