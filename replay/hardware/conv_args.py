"""A traced convolution op's geometry, read from its arguments by the op's PyTorch signature.

A convolution kernel is timed as the implicit GEMM it runs (`ComputeModel.conv`), whose size depends on the
output's spatial extent, hence on the stride, padding and dilation, which are not tensors: a Kineto trace
records them in `Concrete Inputs` (PyTorch >= 2.x), an Execution Trace in the node's input values. Each op
puts them at its own positions (native_functions.yaml), and the backward ops of PyTorch < 1.11 take the size
of the tensor they compute as an int list instead of the tensor. Reading "the first two 4-D tensors" instead
takes a backward-weight op's grad_output and input for input and weight (a 224 x 224 "kernel"), and a
stride-14 patch embedding for a stride-1 convolution: both hundreds of times too much work.
"""
from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class ConvSignature:
    """Argument positions: the input, weight and (backward) grad_output tensors or sizes; stride, padding,
    dilation, groups (None: not an argument, depthwise ops), whether the convolution is transposed (an
    argument position, or True for the transposed ops)."""
    input: int
    weight: int
    grad_output: int | None
    stride: int
    padding: int
    dilation: int | None
    groups: int | None
    transposed: int | bool = False


_FORWARD_CONV = ConvSignature(0, 1, None, 3, 4, 5, 6)              # conv1d/2d/3d(input, weight, bias, ...)
_GENERIC_CONV = ConvSignature(0, 1, None, 3, 4, 5, 8, 6)           # (input, weight, bias, stride, padding,
                                                                   #  dilation, transposed, output_padding, groups)
_CUDNN_BACKWARD = ConvSignature(0, 2, 1, 4, 3, 5, 6)               # (self, grad_output, weight, padding, stride, ...)
CONV_SIGNATURES: dict[str, ConvSignature] = {
    "conv1d": _FORWARD_CONV, "conv2d": _FORWARD_CONV, "conv3d": _FORWARD_CONV,
    "_convolution_mode": _FORWARD_CONV,                            # padding as a string: 'same' / 'valid'
    "convolution": _GENERIC_CONV, "_convolution": _GENERIC_CONV,
    # (self, weight, padding, stride, dilation, groups, benchmark, deterministic, allow_tf32)
    "cudnn_convolution": ConvSignature(0, 1, None, 3, 2, 4, 5),
    # (self, weight, padding, output_padding, stride, dilation, groups, ...)
    "cudnn_convolution_transpose": ConvSignature(0, 1, None, 4, 2, 5, 6, True),
    # (self, weight, bias, padding, stride, dilation, groups, ...): CPU (oneDNN) and ROCm (MIOpen)
    "mkldnn_convolution": ConvSignature(0, 1, None, 4, 3, 5, 6),
    "miopen_convolution": ConvSignature(0, 1, None, 4, 3, 5, 6),
    # (self, weight, kernel_size, bias, stride, padding, dilation): one group per input channel
    "_conv_depthwise2d": ConvSignature(0, 1, None, 4, 5, 6, None),
    "_slow_conv2d_forward": ConvSignature(0, 1, None, 4, 5, None, None),   # (self, weight, k, bias, stride, padding)
    # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask)
    "convolution_backward": ConvSignature(1, 2, 0, 4, 5, 6, 9, 7),
    "cudnn_convolution_backward": _CUDNN_BACKWARD,
    "cudnn_convolution_backward_input": _CUDNN_BACKWARD,          # self_size: an int list
    "cudnn_convolution_backward_weight": ConvSignature(2, 0, 1, 4, 3, 5, 6),   # weight_size: an int list
}
# kernels a convolution op launches besides its implicit GEMM (cuDNN's offset tables, layout transposes,
# Winograd / im2col transforms, split-K reductions): passes over the op's tensors, not its FLOPs
CONV_HELPER_KERNEL = re.compile(r"offsets|scalepacked|flip_filter|im2col|generatewinogradtiles|"
                                r"winograd\w*(data|filter|output|delta)\w*4x4", re.I)


@dataclass(frozen=True)
class ConvGeometry:
    batch: int
    c_in: int
    in_spatial: int       # product of the input's spatial extents
    c_out: int
    kernel: int           # product of the kernel's extents
    out_spatial: int      # product of the output's spatial extents
    groups: int


MAX_ARG = 1 << 31     # a traced size or stride past this is no tensor's (and would overflow float arithmetic)


def _int_list(value: Any) -> list[int] | None:
    """An int list from a traced value: a list, an int, or Kineto's concrete-input string ('[14, 14]', '1');
    None for anything else, and for values past MAX_ARG."""
    got = _parse_int_list(value)
    return got if got is None or all(abs(v) < MAX_ARG for v in got) else None


def _parse_int_list(value: Any) -> list[int] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value] if value and all(isinstance(v, int) and not isinstance(v, bool)
                                                        for v in value) else None
    if isinstance(value, str) and re.fullmatch(r"\s*\[?\s*-?\d+(\s*,\s*-?\d+)*\s*\]?\s*", value):
        return [int(v) for v in re.findall(r"-?\d+", value)]
    return None


def value_list(values: Any) -> Sequence[Any]:
    """A node's traced input values as a list: as read from a trace, or the text a .et file keeps them as
    (Python literal syntax); anything else reads as no values."""
    if isinstance(values, (list, tuple)):
        return values
    if isinstance(values, str) and len(values) < 65536:
        try:
            got = ast.literal_eval(values)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return ()
        return got if isinstance(got, (list, tuple)) else ()
    return ()


def _dims(shapes: Sequence[Any], values: Sequence[Any], pos: int | None) -> list[int] | None:
    """The dims of argument `pos`: its tensor's shape, else the size list it is (backward ops' self_size)."""
    if pos is None:
        return None
    if pos < len(shapes):
        s = shapes[pos]
        if isinstance(s, (list, tuple)) and s and all(isinstance(x, int) for x in s):
            return list(s)
    return _int_list(values[pos]) if pos < len(values) else None


def _per_dim(values: Sequence[Any], pos: int | None, n: int, default: int) -> list[int] | None:
    raw = values[pos] if pos is not None and pos < len(values) else None
    if isinstance(raw, str) and raw.strip().strip("'\"") == "valid":
        return [0] * n          # _convolution_mode's string padding: 'valid' is none, 'same' stays unknown
    got = _int_list(raw)
    if got is None:      # not traced: the default; traced past MAX_ARG: nothing a kernel ran
        return None if _parse_int_list(raw) is not None else [default] * n
    if len(got) == 1:
        return got * n
    return got if len(got) == n else None


def conv_geometry(op: str, shapes: Sequence[Any], values: Sequence[Any] = (),
                  out_shapes: Sequence[Any] = ()) -> ConvGeometry | None:
    """The geometry of a convolution op (`op`: 'aten::conv2d', ...), or None when its arguments do not
    say (an unknown op, a missing weight size). Without stride / padding / dilation values (older traces),
    the output is the grad_output's (backward) or the traced output's extent, else a stride-1 'same' one."""
    sig = CONV_SIGNATURES.get(op.split("::")[-1].lower())
    if sig is None:
        return None
    values = value_list(values)
    x, w = _dims(shapes, values, sig.input), _dims(shapes, values, sig.weight)
    if sig.grad_output is not None and w is not None and (x is None or len(x) != len(w)):
        return _data_gradient_geometry(_dims(shapes, values, sig.grad_output) or _dims(shapes, (), 0), w, values, sig)
    if x is None or w is None or len(x) < 3 or len(w) != len(x) or min(x + w) <= 0:
        return None
    if _transposed(sig, values) and sig.grad_output is None:
        # a transposed convolution is the data gradient of the convolution it inverts: its input plays
        # grad_output (weight [C_in, C_out/g, k...])
        return _data_gradient_geometry(x, w, values, sig)
    n_sp = len(x) - 2
    groups = _int_list(values[sig.groups]) if sig.groups is not None and sig.groups < len(values) else None
    g = groups[0] if groups and len(groups) == 1 and groups[0] >= 1 else max(1, x[1] // w[1])
    if x[1] != w[1] * g:
        return None
    out = _dims(shapes, (), sig.grad_output)
    if out is None and out_shapes:
        out = _dims(out_shapes, (), 0)
    if out is not None and len(out) == len(x) and min(out) > 0:
        out_sp = out[2:]
    else:
        stride = _per_dim(values, sig.stride, n_sp, 1)
        pad = _per_dim(values, sig.padding, n_sp, -1)
        dil = _per_dim(values, sig.dilation, n_sp, 1)
        # arguments no real convolution has (a negative dilation, a padding wider than both the input and
        # the dilated kernel) mean the trace is not what it says: the kernel keeps its time
        if stride is None or pad is None or dil is None or min(stride) < 1 or min(dil) < 1 or any(
                p > max(h, d * (k - 1)) for h, k, p, d in zip(x[2:], w[2:], pad, dil)):
            return None
        # p < 0: padding not traced, the 'same' padding of the stride: ceil(h / s)
        out_sp = [-(-h // s) if p < 0 else (h + 2 * p - d * (k - 1) - 1) // s + 1
                  for h, k, s, p, d in zip(x[2:], w[2:], stride, pad, dil)]
        if min(out_sp) < 1:
            return None
    return ConvGeometry(batch=x[0], c_in=x[1], in_spatial=math.prod(x[2:]), c_out=w[0],
                        kernel=math.prod(w[2:]), out_spatial=math.prod(out_sp), groups=g)


def _data_gradient_geometry(g_out: list[int] | None, w: list[int], values: Sequence[Any],
                            sig: ConvSignature) -> ConvGeometry | None:
    """A backward op traced without its input (only grad_output and weight): the data gradient as the
    convolution it is, of grad_output (C_out channels) by the transposed weight, which has the forward's
    FLOPs (2 x N*out x C_out x C_in/g*k)."""
    if g_out is None or len(g_out) != len(w) or len(w) < 3 or min(g_out + w) <= 0 or g_out[1] != w[0]:
        return None
    groups = _int_list(values[sig.groups]) if sig.groups is not None and sig.groups < len(values) else None
    g = groups[0] if groups and len(groups) == 1 and groups[0] >= 1 else 1
    if w[0] % g:
        return None
    out_sp = math.prod(g_out[2:])
    return ConvGeometry(batch=g_out[0], c_in=g_out[1], in_spatial=out_sp, c_out=w[1] * g,
                        kernel=math.prod(w[2:]), out_spatial=out_sp, groups=g)


def _transposed(sig: ConvSignature, values: Sequence[Any]) -> bool:
    if isinstance(sig.transposed, bool):
        return sig.transposed
    v = values[sig.transposed] if sig.transposed < len(values) else None
    return v is True or (isinstance(v, str) and v.strip().lower() == "true")
