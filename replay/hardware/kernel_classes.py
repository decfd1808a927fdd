"""Kernel classification: what a traced GPU kernel is, from its name and the host op that launched it.

A kernel's class (gemm, conv, attention, elementwise, norm, softmax, reduction, embedding, copy, memset,
optimizer, communication) picks its performance model; its library (cublas, cutlass, cudnn, flash, sdpa,
triton, aten, fbgemm, nccl, ...) and variant flags (split-K, TF32) are reported so that a user can see
what a calibration was fitted on. Names decide first; a name no pattern knows is classified by its
launching CPU op (`aten::sum` -> reduction, `fbgemm::...lookup...` -> embedding), and what is still
unknown is 'other' and listed by `unclassified_report`.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

def _compile(table: list[tuple[str, str]]) -> list[tuple[str, re.Pattern]]:
    """(label, case-insensitive pattern) pairs, in match order."""
    return [(label, re.compile(pattern, re.I)) for label, pattern in table]


# Order matters: the first matching class wins (NCCL before 'reduce', attention before gemm since flash
# kernels contain 'gemm'-like substrings in template arguments, copy before elementwise).
_CLASS_PATTERNS = _compile([
    ("communication", r"nccl|rccl|c10d::|gloo"),
    # cuBLAS's split-K partial-sum reduction: a pass over the output, not a GEMM mainloop
    ("reduction", r"splitkreduce|reduce_splitk|reducesplitk"),
    ("attention", r"flash|fmha|attention|attn|_sdpa|mha_fwd|mha_bwd|dot_do_o|convert_dq"),
    ("memset", r"^memset|\bmemset\b"),
    ("embedding", r"embedding|indexselect|index_select"),
    ("copy", r"^memcpy|memcpy (htod|dtoh|dtod|htoh)|copy_kernel|direct_copy|catarraybatchedcopy"
     r"|nchwtonhwc|nhwctonchw|transpose|permute|contiguous|scatter_gather"
     r"|gather_kernel|\bcopy\b"),
    ("optimizer", r"multi_tensor_apply|adam|sgd_|\blamb_|lamb_kernel|fused_optimizer|optimizer"),
    ("conv", r"conv(?!ert)|fprop|dgrad|wgrad|winograd|implicit_gemm|scudnn|fft2d|cudnn::detail|"
     r"cask_cudnn|cudnn_infer|cudnn_train"),
    ("gemm", r"(?<!fb)gemm|cutlass|xmma|cublas|ampere_|volta_|turing_|hopper_|sm\d\d_|^kernel2"
     r"|matmul|gemv|dot_kernel|nvjet|epilogue::"),
    ("norm", r"layer_norm|layernorm|rms_?norm|batch_?norm|group_?norm|bn_fw|bn_bw|"
     r"gammabetabackward|instance_?norm|norm_kernel"),
    ("softmax", r"softmax"),
    ("embedding", r"embedding|index_put|indexing_backward|embedding_bag"),
    ("reduction", r"reduce|reduction|sum_kernel|mean_kernel|argmax|max_kernel|cub::|scan|"
     r"norm_two|nll_loss|cross_entropy|topk|sort"),
    ("elementwise", r"elementwise|vectorized|unrolled|functor|fill|add|mul|relu|gelu|silu|"
     r"sigmoid|tanh|dropout|clamp|where|cast|pool|upsample|distribution|"
     r"triton_"),
])

# A kernel no name pattern knows: the launching op's name says what it computes.
_OP_PATTERNS = _compile([
    ("embedding", r"embedding|lookup|bounds_check_indices|linearize_index|index_select|"
     r"to_dense_representation|offsets_range"),
    ("attention", r"attention|sdpa|flash"),
    ("conv", r"conv(?!ert)"),
    ("gemm", r"::(mm|addmm|bmm|baddbmm|linear|matmul|_scaled_mm)\b"),
    ("norm", r"norm"),
    ("softmax", r"softmax"),
    ("reduction", r"::(sum|mean|amax|max|min|prod|cumsum|var|std|argmax|topk|sort)\b|cumsum"),
    ("copy", r"copy|::cat\b|::stack\b|permute|recat|::to\b|contiguous"),
    ("elementwise", r"^aten::"),
])

_LIBRARIES = _compile([
    ("nccl", r"nccl|rccl"),
    ("flash", r"flash"),
    ("sdpa", r"fmha|efficient_attention|mem_eff|_sdpa"),
    ("triton", r"triton"),
    ("cudnn", r"cudnn|cask_|implicit_gemm|scudnn|bn_fw|bn_bw"),
    ("cutlass", r"cutlass"),
    ("cublas", r"ampere_|volta_|turing_|hopper_|sm\d\d_xmma_gemm|cublas|gemv|gemmk1|"
     r"splitkreduce|nvjet|epilogue::|^kernel2"),
    ("fbgemm", r"fbgemm|split_embedding|bounds_check|linearize_index"),
    ("aten", r"at::native|at::|cub::"),
    ("runtime", r"^memcpy|^memset"),
])

COMPUTE_CLASSES = frozenset({"gemm", "conv", "attention"})
MEMORY_CLASSES = frozenset({"elementwise", "norm", "softmax", "reduction", "embedding", "copy", "memset",
                            "optimizer"})


@dataclass(frozen=True)
class KernelKind:
    """A kernel's class, the library that wrote it, and GEMM variant flags."""

    cls: str
    library: str
    split_k: bool = False
    tf32: bool = False
    by_op: bool = False        # the class came from the launching op, not the kernel name


@lru_cache(maxsize=65536)
def kernel_class(name: str) -> str:
    """The class of a GPU kernel from its name: gemm, conv, attention, elementwise, norm, softmax,
    reduction, embedding, copy, memset, optimizer, communication, or 'other'."""
    for cls, pat in _CLASS_PATTERNS:
        if pat.search(name):
            return cls
    return "other"


@lru_cache(maxsize=65536)
def classify_kernel(name: str, host_op: str = "") -> KernelKind:
    """Class + library of a kernel; the launching op (`aten::sum`, ...) decides when the name does not."""
    cls = kernel_class(name)
    by_op = False
    if cls == "other" and host_op:
        for c, pat in _OP_PATTERNS:
            if pat.search(host_op):
                cls, by_op = c, True
                break
    library = next((lib for lib, pat in _LIBRARIES if pat.search(name)), "other")
    low = name.lower()
    return KernelKind(cls, library, split_k="splitk" in low or "split_k" in low,
                      tf32="tf32" in low or "s1688" in low or "s16816" in low, by_op=by_op)


@dataclass(frozen=True)
class UnclassifiedKernel:
    name: str
    host_op: str
    count: int
    total_us: float


def unclassified_report(samples: Iterable[tuple[str, str, float]], top: int = 20) -> tuple[float, list[UnclassifiedKernel]]:
    """From (kernel name, host op, duration us) triples: the share of GPU time no class covers, and the
    largest unclassified kernels by total time."""
    total = 0.0
    counts: Counter = Counter()
    times: Counter = Counter()
    for name, op, dur in samples:
        total += dur
        if classify_kernel(name, op).cls == "other":
            counts[(name, op)] += 1
            times[(name, op)] += dur
    rows = [UnclassifiedKernel(n, o, counts[(n, o)], t) for (n, o), t in times.most_common(top)]
    return (sum(times.values()) / total if total else 0.0), rows
