"""A traced attention op's geometry, read from its arguments by the op's PyTorch signature.

An attention kernel is timed by its FLOPs, 4 b h s_q s_kv d (forward), which needs the batch, heads and both
sequence lengths. The ops a kernel is linked to lay their tensors out differently: SDPA's own ops and the
cuDNN ones take [batch, heads, seq, head_dim]; the FlashAttention and memory-efficient entry points they
call take [batch, seq, heads, head_dim] (PyTorch transposes before calling them), as the flash-attn
package's ops do. A trace links a kernel to the innermost op, `aten::_flash_attention_forward` for PyTorch's
flash kernels, so reading every op as [b, h, s, d] swapped heads and sequence: s / h too few FLOPs (32x at
4K tokens and 128 heads). Backward ops take grad_out first, then query, key, value. Whether the attention
is causal is an argument (is_causal, or the memory-efficient kernels' custom_mask_type), recorded in a
Kineto trace's `Concrete Inputs` (PyTorch >= 2.x) or an ET's input values; without it the kernel's name
is the only hint. Argument positions: PyTorch's native_functions.yaml.
"""
from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Any, Sequence

from replay.hardware.conv_args import value_list


@dataclass(frozen=True)
class AttentionSignature:
    """Argument positions of query / key / value, of is_causal (a bool) or custom_mask_type (an int: 0 none,
    1-2 causal) and of max_q / max_k (variable-length batches, whose query is [total tokens, heads, d]);
    `heads_first`: [b, h, s, d] rather than [b, s, h, d]."""
    heads_first: bool
    query: int
    key: int
    value: int
    backward: bool
    is_causal: int | None = None
    mask_type: int | None = None
    max_q: int | None = None
    max_k: int | None = None


_SDPA_FLASH_BWD = AttentionSignature(True, 1, 2, 3, True, is_causal=11, max_q=8, max_k=9)
_CUDNN_BWD = AttentionSignature(True, 1, 2, 3, True, is_causal=14, max_q=11, max_k=12)
ATTENTION_SIGNATURES: dict[str, AttentionSignature] = {
    # (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    "scaled_dot_product_attention": AttentionSignature(True, 0, 1, 2, False, is_causal=5),
    # (query, key, value, dropout_p, is_causal, return_debug_mask, scale)
    "_scaled_dot_product_flash_attention": AttentionSignature(True, 0, 1, 2, False, is_causal=4),
    # (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, ...)
    "_scaled_dot_product_flash_attention_backward": _SDPA_FLASH_BWD,
    # (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, scale)
    "_scaled_dot_product_efficient_attention": AttentionSignature(True, 0, 1, 2, False, is_causal=6),
    # (grad_out_, query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset, dropout_p,
    #  grad_input_mask, is_causal, scale)
    "_scaled_dot_product_efficient_attention_backward": AttentionSignature(True, 1, 2, 3, True, is_causal=11),
    # (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask, scale)
    "_scaled_dot_product_cudnn_attention": AttentionSignature(True, 0, 1, 2, False, is_causal=6),
    # (grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias, cum_seq_q, cum_seq_k,
    #  max_q, max_k, dropout_p, is_causal, scale)
    "_scaled_dot_product_cudnn_attention_backward": _CUDNN_BWD,
    # (query, key, value, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, compute_log_sumexp, dropout_p,
    #  is_causal, return_debug_mask, scale)
    "_cudnn_attention_forward": AttentionSignature(True, 0, 1, 2, False, is_causal=10, max_q=6, max_k=7),
    "_cudnn_attention_backward": _CUDNN_BWD,
    # (query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, scale, ...)
    "_flash_attention_forward": AttentionSignature(False, 0, 1, 2, False, is_causal=8, max_q=5, max_k=6),
    # (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, ...)
    "_flash_attention_backward": AttentionSignature(False, 1, 2, 3, True, is_causal=11, max_q=8, max_k=9),
    # (query, key, value, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
    #  custom_mask_type, ...)
    "_efficient_attention_forward": AttentionSignature(False, 0, 1, 2, False, mask_type=9, max_q=6, max_k=7),
    # (grad_out_, query, key, value, bias, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    #  logsumexp, dropout_p, philox_seed, philox_offset, custom_mask_type, ...)
    "_efficient_attention_backward": AttentionSignature(False, 1, 2, 3, True, mask_type=14, max_q=8, max_k=9),
    # the flash-attn package (flash_attn::_flash_attn_forward(q, k, v, ...), _flash_attn_backward(dout, q, k, v,
    # ...)): its scalar arguments moved between releases, so only the tensors are read
    "_flash_attn_forward": AttentionSignature(False, 0, 1, 2, False),
    "_flash_attn_backward": AttentionSignature(False, 1, 2, 3, True),
}


@dataclass(frozen=True)
class AttentionGeometry:
    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    v_head_dim: int
    backward: bool
    causal: bool | None       # None: the trace does not say


_INTEGER = re.compile(r"-?[0-9]{1,18}")   # ASCII digits only (isdigit() takes '²'), and few (int() refuses 4,300)


def signature_of(op: str) -> AttentionSignature | None:
    return ATTENTION_SIGNATURES.get(op.split("::")[-1].lower())


def attention_geometry(op: str, shapes: Sequence[Any], values: Any = ()) -> AttentionGeometry | None:
    """The geometry of an attention op (`op`: 'aten::_flash_attention_forward', ...), or None when the op is
    not a known signature or its tensors do not say (a variable-length batch without its max_q)."""
    sig = signature_of(op)
    if sig is None:
        return None
    values = value_list(values)
    q, k, v = (_shape(shapes, i) for i in (sig.query, sig.key, sig.value))
    if q is None or k is None or len(k) != len(q) or len(q) not in (3, 4) or min(q + k) <= 0:
        return None
    if len(q) == 4:
        b, sq, h, d = (q[0], q[2], q[1], q[3]) if sig.heads_first else q
        skv, kvh = (k[2], k[1]) if sig.heads_first else (k[1], k[2])
    else:   # variable-length: [total tokens, heads, d]
        b, sq, skv, h, d, kvh = 1, q[0], k[0], q[1], q[2], k[1]
    # a packed batch (cu_seqlens; the memory-efficient kernels take it as [1, total, h, d]): sequences of
    # at most max_q / max_k tokens, taken as that many full ones; a max past the tokens is not a packing
    max_q, max_k = _int(values, sig.max_q), _int(values, sig.max_k)
    packed = b == 1 and max_q is not None and max_k is not None and 0 < max_q <= sq and 0 < max_k <= skv
    if packed:   # at least as many sequences as either side needs; no side holds more tokens than recorded
        b = max(1, sq // max_q, skv // max_k)
        sq, skv = min(max_q, max(1, sq // b)), min(max_k, max(1, skv // b))
    elif len(q) == 3:
        return None          # variable-length without its max lengths: the sequences are unknown
    if v is not None and len(v) == len(q) and min(v) <= 0:
        return None
    dv = v[-1] if v is not None and len(v) == len(q) else d
    return AttentionGeometry(b, h, kvh, sq, skv, d, dv, sig.backward, _causal(values, sig))


def _shape(shapes: Sequence[Any], pos: int) -> list[int] | None:
    s = shapes[pos] if pos < len(shapes) else None
    if isinstance(s, (list, tuple)) and s and all(isinstance(x, int) and not isinstance(x, bool) for x in s):
        return list(s)
    return None


def _int(values: Sequence[Any], pos: int | None) -> int | None:
    raw = values[pos] if pos is not None and pos < len(values) else None
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and _INTEGER.fullmatch(raw.strip()):
        return int(raw.strip())
    return None


def _causal(values: Sequence[Any], sig: AttentionSignature) -> bool | None:
    if sig.is_causal is not None and sig.is_causal < len(values):
        raw = values[sig.is_causal]
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        return None
    mask = _int(values, sig.mask_type)
    return None if mask is None else mask > 0
