"""Model mode from an Execution Trace alone: infer the GPU kernels each ATen op launches, and a host
timeline, so that the replay engine and `ModelTiming` time the step with the same kernel models as a
Kineto-linked trace.

    infer_gpu_work(graph, host=HOST_MODEL) -> (ExecutionGraph, InferenceReport)

An ET records every operator with its input / output shapes and dtypes but no kernel and no time. The
rules below say which kernels a CUDA run launches for an op; they were learned from, and are checked
against, the kernels Kineto attributes to each op in the H100 traces of tests/data/h100 (see
tests/test_et_only_kernels.py), never from per-trace figures:

- The innermost ops launch kernels (`aten::linear` -> `aten::mm`: the kernel belongs to `aten::mm`), except
  that a GEMM / convolution / attention / norm / softmax / embedding op with no such op below it keeps its
  kernel: beside its children's in a CUDA trace (softmax backward's mul, embedding backward's sort passes
  are kernels of their own), instead of them in a CPU trace (there the children are the CPU implementation's
  helpers: addmm's bias copy, mkldnn restrides, zeroed accumulators), and a foreach / fused optimizer op
  replaces its children (a CPU run loops it per tensor). An op launches nothing when its outputs only alias
  its inputs (views: view, t, transpose, slice, ...; an out= variant, `Tensor(a!) out`, computes), when it
  only allocates (empty*, resize_, as_strided_), or when it has no tensors on the GPU.
- Convolutions (cudnn_convolution, convolution_backward, ...): implicit GEMMs (forward; dgrad and wgrad as
  the backward's outputs ask), timed by the GEMM model.
- GEMMs (mm, addmm, bmm, baddbmm, linear, matmul, _scaled_mm, ...): one `gemm` kernel with m, n, k and the
  batch from the shapes (transposes are views: the shapes that reach mm are the GEMM's).
- Attention (scaled_dot_product_* / flash / efficient / cuDNN attention, forward and backward): one
  `attention` kernel from q / k / v in the op's own layout and its causal flag (the op's signature,
  replay/hardware/attention_args.py; GQA: k's heads); the backward adds its pre/post passes (rowsum of
  dO*O, dQ conversion) as memory streams over Q-sized tensors.
- Optimizers (`_foreach_*`, `_fused_adam*`, `_fused_sgd_`): PyTorch's multi_tensor_apply launches one
  kernel per group of at most 320 blocks of 65536 elements and at most 110/64/48/36/30 tensors for 1..5
  tensor lists (aten/src/ATen/native/cuda/MultiTensorApply.cuh, kChunkSize, depth_to_max_tensors,
  depth_to_max_tensors_scalarlist); each kernel streams the elements of its group through every list.
  Each launch's CTAs (one per chunk) fill the SMs in waves: model_timing scales its bandwidth time by
  ceil(blocks / SMs) * SMs / blocks (320 chunks on 132 SMs: 1.24x).
- Norms, softmax, reductions, embeddings, copies, everything else elementwise: one kernel of that class
  moving its inputs' bytes plus its outputs' bytes (the output shapes are in the ET). A softmax whose row
  exceeds a block's shared memory streams the row once per pass (forward 3 reads + 1 write).
- Elementwise ops and copies with a non-contiguous operand (the ET's strides: a transposed or sliced view)
  or a broadcast operand run TensorIterator's generic, non-vectorized kernel: marked `strided`, timed by
  the preset's pooled model of those kernels (kernel_models.STRIDED_KEY, ~half the vectorized bandwidth).
- Copies between host and device are memcpys over PCIe.
- Collectives keep their sizes and process groups from the trace and move to a GPU communication stream
  (a CPU trace's gloo transfers become the NCCL collectives a CUDA run would issue).

Kernels are timed by `ComputeModel.op_estimate` (the preset's fitted class model per kernel class and
dtype: the same models as model mode with Kineto). Ops that launch kernels by these rules but whose work
cannot be told (an unknown custom op, shapes missing) are counted in the report with their share of the
step, never timed as zero silently.

Host timeline (`HostModel`): the ET has no host times either. Each op costs `op_us` of dispatch, each
kernel launch `launch_us`, and each top-level op (one Python call) `python_us` before it; threads share
one clock in ET order (ids are assigned when an op starts, whichever thread runs it). An op that reads a
GPU value on the host (`aten::_local_scalar_dense`, a device-to-host copy, `aten::nonzero`) waits for the
kernels launched before it; a ProfilerStep ends when the kernels it launched have finished (training loops
synchronize every step).
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import EdgeKind, ExecutionGraph, GraphBuilder, NodeType, OpKind, ResourceKind

from .hardware.attention_args import attention_geometry, signature_of
from .hardware.compute import DTYPE_BYTES, _dtype_of, _elem_bytes, _gemm_dims, _numel, arg_list, check_tensor_shapes

COMPUTE_STREAM = 7         # CUDA's default stream as Kineto numbers it
COMM_STREAM_BASE = 1000    # same numbering as chakra_schema.pytorch.et_graph

__all__ = ["HostModel", "HOST_MODEL", "InferenceReport", "KernelSpec", "can_infer", "infer_gpu_work", "op_kernels",
           "needs_inference", "records_gpu_work"]


@dataclass(frozen=True)
class HostModel:
    """Host time of an ET op (an ET records none). Each operator node (nested ones included) costs `op_us`
    of dispatch and bookkeeping, each kernel launch `launch_us` (cudaLaunchKernel), and each top-level op
    `python_us` of Python before it. Defaults: the H100 Kineto + ET traces of tests/data/h100 (torch 2.11,
    profiled, so the ET observer's own cost is included), per trace the mean self time of an operator
    (16-24 us Llama, 35-37 us MoE), of a launch call (7-11 us) and of the gap between two top-level ops
    (11-24 us), averaged over the two workloads with equal weight."""

    op_us: float = 28.0
    launch_us: float = 9.6
    python_us: float = 19.0
    # The first GEMM of a shape and operand layout in a process costs the host a cuBLAS algorithm search
    # (heuristic query, plan setup) before its launch; later GEMMs of that shape and layout reuse it. Static
    # shapes were searched in the warm-up steps; data-dependent ones (MoE experts' token counts, varying
    # sequence lengths) are new in every step. Measured in the H100 MoE traces of tests/data/h100 (torch 2.11,
    # CUDA 13.0), keyed as _gemm_key keys them: aten::mm of a shape and layout not run in every step and
    # first seen in the trace spends a mean 469 us (4,096 tokens) / 794 us (16,384 tokens) on the host, one
    # seen before 99 / 94 us: 535 us extra, pooled over both traces (138 first-seen GEMMs each). The mean,
    # not the median (347 / 290 us, 230 us extra): a step's host time is the sum of these costs, and a few
    # first-seen GEMMs (7 of 276) stall 4.6-38 ms on the host before their launch, with no runtime call
    # traced inside (cuBLAS selecting and loading a kernel the process has not run yet); the median leaves
    # them out and under-predicts every step that has them. Those stalls are first uses in the process, and
    # these traces record steps 3-5 of young processes: deep into a long run, with most kernels loaded, they
    # are rarer and this figure overstates a step's host time (at most by the 305 us over the median, per
    # first-seen GEMM). Held out by token count, either trace's own figure (370 / 700 us) predicts the
    # other's steps within 6.3% / 4.7%. The Llama traces (static shapes) hold no such GEMM, so they do not
    # inform it. tests/test_et_only_gemm_search.py re-measures it from the traces.
    new_gemm_shape_us: float = 535.0


HOST_MODEL = HostModel()


@dataclass(frozen=True)
class KernelSpec:
    """One inferred GPU kernel: a name for the timeline and the `op` attrs contract ComputeModel times."""

    name: str
    attrs: dict


@dataclass
class InferenceReport:
    """What model mode inferred from an ET alone."""

    ops: int = 0                          # operator nodes seen
    launching_ops: int = 0                # ops that launch kernels by the rules
    kernels: int = 0
    kernels_by_class: Counter = field(default_factory=Counter)
    uninferred: Counter = field(default_factory=Counter)   # op name -> count: launches, work unknown
    cpu_trace: bool = False               # tensors were on the CPU: the kernels are those of a CUDA run
    collectives_moved: int = 0            # host (gloo) transfers moved to a GPU communication stream
    new_gemm_shapes: int = 0              # GEMMs whose shape is not in every step: a cuBLAS search each
    compiled_regions: int = 0             # torch.compile graphs run: their fused kernels are not in the ET
    empty_steps_dropped: list = field(default_factory=list)   # the ET's trailing ProfilerSteps with no ops

    def lines(self) -> list[str]:
        out = [f"inferred {self.kernels:,} GPU kernels from {self.launching_ops:,} of {self.ops:,} ET ops ("
               + ", ".join(f"{c} {n}" for c, n in self.kernels_by_class.most_common()) + ")"]
        if self.cpu_trace:
            out.append("the trace ran on the CPU: ops are timed as the CUDA kernels a GPU run would launch"
                       + (f"; {self.collectives_moved} gloo collectives timed as NCCL collectives"
                          if self.collectives_moved else ""))
        if self.compiled_regions:
            out.append(f"{self.compiled_regions:,} torch.compile graph calls: their fused (Triton) kernels are not "
                       "ATen ops, so the ET does not record them and they are not timed; only the ATen ops they "
                       "call (GEMMs, ...) are")
        if self.uninferred:
            n = sum(self.uninferred.values())
            out.append(f"kernels not inferred for {n:,} ops ({100 * n / max(self.ops, 1):.1f}% of the ET's operators; "
                       "their work is unknown, so they are timed as host time only): "
                       + ", ".join(f"{name} x{c}" for name, c in self.uninferred.most_common(8)))
        elif not self.compiled_regions:
            out.append("every operator's kernels were inferred")
        if self.empty_steps_dropped:
            out.append(f"not a step: {', '.join(self.empty_steps_dropped)} (a ProfilerStep of the ET that holds no op)")
        if self.new_gemm_shapes:
            out.append(f"{self.new_gemm_shapes:,} GEMM{'s' if self.new_gemm_shapes != 1 else ''} of a shape not run "
                       "in every step (data-dependent) pay the "
                       "host's cuBLAS algorithm search")
        return out

    def to_json(self) -> dict:
        return {"ops": self.ops, "launching_ops": self.launching_ops, "kernels": self.kernels,
                "kernels_by_class": dict(self.kernels_by_class), "uninferred": dict(self.uninferred),
                "cpu_trace": self.cpu_trace, "collectives_moved": self.collectives_moved,
                "new_gemm_shapes": self.new_gemm_shapes, "compiled_regions": self.compiled_regions,
                "empty_steps_dropped": list(self.empty_steps_dropped)}


# ----------------------------------------------------------------------------------- op -> kernels
_ALLOC_OR_META = re.compile(
    r"::(empty|empty_like|empty_strided|new_empty|new_empty_strided|resize_|resize_as_|set_|as_strided_|"
    r"record_stream|_local_scalar_dense_cpu|size|stride|numel|is_nonzero|result_type|"
    r"_has_compatible_shallow_copy_type|retains_grad|requires_grad_|lift_fresh|_nested_tensor_from_mask)$")
_SYNCS = re.compile(r"::(_local_scalar_dense|nonzero|nonzero_static|unique|_unique2|tolist|"
                    r"masked_select|repeat_interleave)$")
_GEMM = re.compile(r"::(mm|addmm|_addmm_activation|bmm|baddbmm|linear|matmul|_scaled_mm|addbmm|mv|addmv|dot)$")
_ATTENTION = re.compile(r"attention|flash|_sdpa|scaled_dot_product", re.I)
_CONV = re.compile(r"::(convolution|_convolution|cudnn_convolution|cudnn_convolution_transpose|conv[123]d|"
                   r"convolution_backward|_convolution_double_backward|miopen_convolution|mkldnn_convolution|"
                   r"_slow_conv2d_forward|slow_conv3d_forward|conv_depthwise2d|_conv_depthwise2d)$")
_OPTIMIZER = re.compile(r"::(_foreach_\w+|_fused_adamw?_|_fused_sgd_|_fused_adagrad_)$")
_NORM = re.compile(r"norm", re.I)
_SOFTMAX = re.compile(r"softmax", re.I)
_REDUCTION = re.compile(r"::(sum|mean|amax|amin|max|min|prod|cumsum|cumprod|var|std|var_mean|std_mean|"
                        r"argmax|argmin|topk|sort|argsort|logsumexp|nll_loss\w*|cross_entropy\w*|all|any|"
                        r"index_add_|bincount|histc|scatter_add_|scatter_reduce_|count_nonzero|"
                        r"linalg_vector_norm|norm|_fused_dropout)$")
_EMBEDDING = re.compile(r"::(embedding|embedding_dense_backward|embedding_backward|index_select|"
                        r"_embedding_bag\w*|embedding_bag\w*)$")
_COPY = re.compile(r"::(copy_|_to_copy|clone|cat|stack|contiguous|index|gather|scatter_|scatter|"
                   r"index_put_|_index_put_impl_|masked_scatter_|_copy_from|_copy_from_and_resize|"
                   r"constant_pad_nd|repeat|flip|roll|tril|triu|where)$")
_NOT_OPS = ("torch::autograd::", "autograd::", "c10d::", "profiler::", "record_param_comms", "nccl:", "gloo:")
# multi_tensor_apply launch limits (aten/src/ATen/native/cuda/MultiTensorApply.cuh)
_CHUNK = 65536
_MAX_BLOCKS = 320
_MAX_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}


def _leaf_types(t: Any) -> list[str]:
    """'GenericList[Tensor(float),Tensor(float)]' -> ['Tensor(float)', 'Tensor(float)']."""
    s = str(t)
    if s.startswith("GenericList[") and s.endswith("]"):
        return [x for x in re.findall(r"Tensor\([^)]*\)|[A-Za-z]+", s[len("GenericList["):-1])]
    return [s]


def _tensor_bytes(shapes: Sequence[Any], types: Sequence[Any]) -> tuple[float, list[list[int]]]:
    """Bytes of every plain tensor among the arguments, and the tensor lists (numel per element)."""
    total = 0.0
    lists: list[list[int]] = []
    for k, s in enumerate(shapes or []):
        t = types[k] if k < len(types) else ""
        if not isinstance(s, (list, tuple)) or "Tensor" not in str(t):
            continue
        if s and all(isinstance(x, (list, tuple)) for x in s):        # a tensor list
            ltypes = _leaf_types(t)
            numels = [_count(x) for x in s]
            lists.append(numels)
            total += sum(n * _elem_bytes(ltypes[j] if j < len(ltypes) else "float") for j, n in enumerate(numels))
        else:
            total += _count(s) * _elem_bytes(t)
    return total, lists


def _count(shape: Any) -> int:
    """Elements of a tensor shape; a 0-dim tensor ([]) holds one."""
    if isinstance(shape, (list, tuple)) and not shape:
        return 1
    return _numel(shape)


def _mta_groups(numels: list[int], depth: int) -> list[tuple[int, int]]:
    """(elements, blocks) per kernel launch of multi_tensor_apply over tensors of `numels` (per list): a
    launch closes when it holds _MAX_BLOCKS chunks (one CTA each), or the tensor limit is reached at a
    tensor's last chunk (a tensor split across launches continues in the next one)."""
    max_tensors = _MAX_TENSORS.get(min(max(depth, 1), 5), 30)
    groups: list[tuple[int, int]] = []
    tensors = blocks = elems = 0
    for n in numels:
        if n <= 0:
            continue
        chunks = math.ceil(n / _CHUNK)
        tensors += 1
        c = 0
        while c < chunks:
            take = min(chunks - c, _MAX_BLOCKS - blocks)
            elems += min(take * _CHUNK, n - c * _CHUNK)
            blocks += take
            c += take
            done = c == chunks
            if blocks == _MAX_BLOCKS or (done and tensors == max_tensors):
                groups.append((elems, blocks))
                blocks = elems = 0
                tensors = 0 if done else 1
    if elems:
        groups.append((elems, blocks))
    return groups


def _is_causal(attrs: dict, default: bool = False) -> bool:
    """The `is_causal` argument, found by name in the op schema."""
    schema = str(attrs.get("op_schema", ""))
    scalars = attrs.get("scalar_inputs") or []
    if "(" not in schema:
        return default
    args = schema.split("(", 1)[1].rsplit(") ->", 1)[0]
    names = [a.strip().split("=")[0].split()[-1] for a in args.split(",") if a.strip() and a.strip() != "*"]
    if "is_causal" in names:
        k = names.index("is_causal")
        if k < len(scalars) and scalars[k] is not None:
            return bool(scalars[k])
    return default


def op_kernels(name: str, attrs: dict | None) -> list[KernelSpec] | None:
    """The kernels a CUDA run launches for ATen op `name` with its ET attrs; [] for none, None when the op
    launches kernels whose work the shapes do not tell (reported as not inferred)."""
    a = attrs or {}
    low = name.lower()
    if "::" not in low or low.startswith(_NOT_OPS):
        # Python functions, autograd nodes, record_function ranges, c10d front ends (the collective is
        # its own node): their ATen children launch the kernels
        return []
    if _ALLOC_OR_META.search(low) or (a.get("outputs_alias_inputs") and not low.endswith("_")
                                      and "(a!)" not in str(a.get("op_schema", ""))):
        return []   # a view; an out= variant (`Tensor(a!) out`, as torch.compile's extern GEMMs) computes
    shapes, types = arg_list(a, "input_shapes"), arg_list(a, "input_types")
    out_shapes, out_types = arg_list(a, "output_shapes"), arg_list(a, "output_types")
    dtype = _dtype_of([t for t in types if "Tensor" in str(t)], "")[0]
    tens = [list(s) for s, t in zip(shapes, types)
            if "Tensor(" in str(t) and "GenericList" not in str(t) and isinstance(s, (list, tuple)) and s
            and all(isinstance(x, int) for x in s)]
    in_bytes, lists = _tensor_bytes(shapes, types)
    out_bytes, _ = _tensor_bytes(out_shapes, out_types)

    if _OPTIMIZER.search(low):
        if not lists:
            return None
        numels = lists[0]
        # every list is walked in step with the first; out-of-place foreach ops write one more list
        depth = len(lists) + (1 if out_bytes > 0 and not low.endswith("_") else 0)
        per_elem = (in_bytes + out_bytes) / max(sum(numels), 1)
        # in-place lists are written back: the mutable (a!) lists of the schema
        written = str(a.get("op_schema", "")).count("!)[]")
        if written and sum(numels):
            per_elem += sum(sum(lst) for lst in lists[:written]) * (in_bytes / max(sum(map(sum, lists)), 1)) \
                / max(sum(numels), 1)
        # `blocks`: the launch's CTAs, for its wave quantization (ComputeModel-independent, model_timing)
        return [KernelSpec("multi_tensor_apply_kernel", {"op": "optimizer", "dtype": dtype,
                                                         "bytes": float(g * per_elem), "blocks": nb})
                for g, nb in _mta_groups(numels, depth)]
    if _ATTENTION.search(low):
        # the op's own layout and causal flag by its signature (replay/hardware/attention_args.py), as for
        # traced kernels; an op of no known signature: [b, h, s, d] tensors, is_causal by its schema's name
        geo = attention_geometry(name, shapes, a.get("input_values") or ())
        dv = None
        if geo is not None:
            b, h, sq, skv, d, kvh, backward = (geo.batch, geo.heads, geo.seq_q, geo.seq_kv, geo.head_dim,
                                               geo.kv_heads, geo.backward)
            causal = geo.causal if geo.causal is not None else _is_causal(a)
            dv = geo.v_head_dim
        elif signature_of(name) is not None:
            return None
        else:
            backward = "backward" in low
            qkv = tens[1:4] if backward and len(tens) >= 4 else tens[:3]
            if len(qkv) < 2 or len(qkv[0]) != 4 or len(qkv[1]) != 4:
                return None
            b, h, sq, d = qkv[0]
            kvh, skv = qkv[1][1], qkv[1][2]
            causal = _is_causal(a)
        att = {"op": "attention", "dtype": dtype, "batch": b, "heads": h, "seq_q": sq, "seq_kv": skv,
               "head_dim": d, "kv_heads": kvh, "causal": causal, "backward": backward}
        if dv is not None and dv != d:
            att["v_head_dim"] = dv     # MLA: values narrower than queries and keys
        kernels = [KernelSpec("attention_bwd" if backward else "attention_fwd", att)]
        if backward:
            # the backward's passes over Q-sized tensors (rowsum of dO*O before, dQ accumulator conversion
            # after, and with grouped KV heads one head reduction each for dK and dV), each streaming
            # three Q-sized tensors as compute.estimate_from_shapes times such traced helpers
            e = _elem_bytes(types[1] if len(types) > 1 else "")
            helper = {"op": "attention", "dtype": dtype, "bytes": 3.0 * b * h * sq * d * e}
            names = ["attention_bwd_dot_do_o", "attention_bwd_convert_dq"]
            if kvh < h:
                names += ["attention_bwd_reduce_head_dk", "attention_bwd_reduce_head_dv"]
            kernels += [KernelSpec(nm, helper) for nm in names]
        return kernels
    if _CONV.search(low):
        return _conv_kernels(low, tens, out_shapes, dtype)
    dims = _gemm_dims(low, tens) if _GEMM.search(low) else None
    if dims is not None:
        m, n, k, batch = dims
        return [KernelSpec("gemm", {"op": "gemm", "dtype": dtype, "m": m, "n": n, "k": k, "batch": batch,
                                    "layout": _operand_layout(low, a)})]
    if _GEMM.search(low):
        return None
    if not low.startswith("aten::"):
        return None   # a custom op: its shapes do not tell its kernels
    nbytes = in_bytes + out_bytes
    if nbytes <= 0:
        return None if (shapes or out_shapes) and not _only_scalars(types) else []
    direction = _copy_direction(low, a)
    if direction:
        # non_blocking=False (the default) makes the host wait for the copy (cudaStreamSynchronize)
        scalars = a.get("scalar_inputs") or []
        blocking = not any(v is True for v in scalars)
        return [KernelSpec("Memcpy " + direction.upper(), {"op": "memcpy", "dtype": dtype,
                                                           "bytes": float(in_bytes / 2 or out_bytes),
                                                           "direction": direction, "host_waits": blocking})]
    if low.endswith(("fill_", "zero_")):
        cls, nbytes = "elementwise", out_bytes or in_bytes
    elif _SOFTMAX.search(low):
        cls = "softmax"
        nbytes = _softmax_bytes(low, tens, types, in_bytes, out_bytes)
    elif _NORM.search(low) and not _REDUCTION.search(low):
        if "backward" in low and len(tens) >= 3:
            # the input-gradient pass, then the weight (and bias) gradient: a column reduction over
            # grad_out and the input (Kineto: two norm kernels per layer/rms norm backward)
            e = _elem_bytes(types[0] if types else "")
            pass2 = 2.0 * _count(tens[0]) * e
            return [KernelSpec("norm_bwd_input", {"op": "norm", "dtype": dtype, "bytes": float(nbytes)}),
                    KernelSpec("norm_bwd_weight", {"op": "norm", "dtype": dtype, "bytes": float(pass2)})]
        cls = "norm"
    elif _EMBEDDING.search(low):
        cls = "embedding"
        if "backward" not in low and len(tens) >= 2:
            # reads the selected rows and writes them; the table itself is not streamed
            e = _elem_bytes(types[0] if types else "")
            idx = _numel(tens[1])
            nbytes = 2.0 * idx * tens[0][-1] * e + idx * 8
    elif _REDUCTION.search(low):
        cls = "reduction"
    elif _COPY.search(low):
        cls = "copy"
    else:
        cls = "elementwise"
    attrs = {"op": cls, "dtype": dtype, "bytes": float(nbytes)}
    if cls in ("elementwise", "copy") and _strided(a, tens, out_shapes):
        # TensorIterator vectorizes (16-byte loads, `vectorized_elementwise_kernel`, `CatArrayBatchedCopy_
        # vectorized`) only when every operand is contiguous; a transposed / sliced / broadcast operand takes
        # the generic kernel (per-element offset arithmetic, scalar loads), timed by the preset's fitted
        # model of those kernels (kernel_models.STRIDED_KEY)
        attrs["strided"] = True
    return [KernelSpec(cls, attrs)]


def _contiguous(shape: Sequence[int], strides: Any) -> bool:
    """Whether a tensor of `shape` with `strides` is laid out densely in row-major order (size-1 dims'
    strides do not matter)."""
    if not isinstance(strides, (list, tuple)) or len(strides) != len(shape):
        return True   # not recorded: assume the common case
    expect = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expect:
            return False
        expect *= size
    return True


def _strided(a: dict, tens: list[list[int]], out_shapes: Sequence[Any]) -> bool:
    """An op whose plain tensor operands are not all contiguous and of one shape: a view (strides) or a
    broadcast operand (an input with more than one element but fewer than the output)."""
    shapes, types, strides = arg_list(a, "input_shapes"), arg_list(a, "input_types"), arg_list(a, "input_strides")
    outs = [list(s) for s in out_shapes if isinstance(s, (list, tuple)) and s and all(isinstance(x, int) for x in s)]
    out_n = max((_count(s) for s in outs), default=0)
    for k, s in enumerate(shapes):
        t = types[k] if k < len(types) else ""
        if "Tensor(" not in str(t) or "GenericList" in str(t) or not isinstance(s, (list, tuple)) or not s \
                or not all(isinstance(x, int) for x in s):
            if "GenericList" in str(t) and k < len(strides) and isinstance(s, (list, tuple)):
                # a tensor list (cat / stack inputs): any strided member
                if any(isinstance(x, (list, tuple)) and not _contiguous(x, st)
                       for x, st in zip(s, strides[k] if isinstance(strides[k], (list, tuple)) else [])):
                    return True
            continue
        if k < len(strides) and not _contiguous(s, strides[k]):
            return True
        if 1 < _count(s) < out_n:
            return True
    ostr = arg_list(a, "output_strides")
    return any(not _contiguous(s, ostr[k]) for k, s in enumerate(outs) if k < len(ostr))


# dynamic shared memory a softmax block stages a row in without opting in (48 KiB, CUDA's default limit)
_SOFTMAX_SMEM = 48 * 1024


def _softmax_bytes(low: str, tens: list[list[int]], types: Sequence[Any], in_bytes: float, out_bytes: float) -> float:
    """DRAM traffic of a (log_)softmax over the last dim. A row that fits in a block's shared memory is
    read once and written once; a longer row (PyTorch's cunn_SoftMaxForward / Backward,
    aten/src/ATen/native/cuda/SoftMax.cu) is streamed once per pass: forward reads it for the max, for
    the sum of exponentials and for the output (3 reads + 1 write); backward reads grad for the row sum
    (with the output too for softmax), then grad and output for the result (log_softmax: 3 reads + 1
    write of the row, softmax: 4 + 1)."""
    if not tens:
        return in_bytes + out_bytes
    e = _elem_bytes(types[0] if types else "")
    row = tens[0][-1] * e
    if row <= _SOFTMAX_SMEM:
        return in_bytes + out_bytes
    size = _count(tens[0]) * e
    if "backward" in low:
        return size * (4.0 if "log" in low else 5.0)
    return size * 4.0


def _copy_direction(low: str, a: dict) -> str:
    """'htod' / 'dtoh' for a copy between host and device memory, '' otherwise."""
    if low.split("::")[-1] not in ("copy_", "_copy_from", "_to_copy", "_copy_from_and_resize"):
        return ""
    ins, outs = a.get("input_devices") or [], a.get("output_devices") or []
    if not ins or "cpu" not in set(ins) | set(outs) or len(set(ins) | set(outs)) < 2:
        return ""
    dst = outs[0] if outs else ins[0]
    return "dtoh" if dst == "cpu" else "htod"


def _only_scalars(types: Sequence[Any]) -> bool:
    return not any("Tensor" in str(t) for t in types)


# ------------------------------------------------------------------------------------ the rebuild
def needs_inference(graph: ExecutionGraph) -> bool:
    """A graph without GPU kernels that model mode must infer them for: an ET alone (durations unknown), or
    a trace of a CPU run (its recorded op times are CPU compute, not what a GPU would take)."""
    meta = graph.metadata or {}
    if meta.get("durations_known") is not False and graph.trace_origin != "kineto":
        return False   # a graph with durations that is not a PyTorch trace (a Chakra / ASTRA-sim .et)
    return not records_gpu_work(graph) and bool((graph.kind == int(OpKind.CPU_OP)).any())


def records_gpu_work(graph: ExecutionGraph) -> bool:
    """Whether the graph holds GPU kernels, copies or memsets."""
    return bool(graph.is_gpu()[np.isin(graph.kind, [int(OpKind.KERNEL), int(OpKind.MEMCPY), int(OpKind.MEMSET)])].any())


def can_infer(graph: ExecutionGraph) -> bool:
    """Whether the graph's ops carry what inference reads: an ET's tensors (a Kineto trace alone records
    shapes at most, not the tensors' devices, dtypes and aliasing)."""
    return graph.trace_origin == "execution_trace" or \
        any("tensor_devices" in a for a in graph.attrs.values())


def infer_gpu_work(graph: ExecutionGraph, host: HostModel = HOST_MODEL) -> tuple[ExecutionGraph, InferenceReport]:
    """A copy of ET-only `graph` with inferred kernels (see the module docstring) and a host timeline."""
    n = len(graph)
    report = InferenceReport()
    kinds = graph.kind.tolist()
    parent = graph.parent.tolist()
    gpu_res = {i for i, r in enumerate(graph.resources) if r.kind == ResourceKind.GPU_STREAM}
    res_of = graph.resource.tolist()
    # a CUDA trace keeps CPU-tensor ops on the host; a CPU trace (no CUDA tensor at all) is what-if GPU
    devices: set[str] = set()
    for a in graph.attrs.values():
        devices.update(a.get("tensor_devices") or ())
    gpu_devices = {"cuda", "hip", "xpu", "mtia"} & devices
    report.cpu_trace = not gpu_devices
    report.empty_steps_dropped = list((graph.metadata or {}).get("empty_steps_dropped") or [])
    device = graph.rank

    b = GraphBuilder(rank=graph.rank, world_size=graph.world_size)
    b.metadata.update(graph.metadata or {})
    b.metadata["durations_known"] = False
    b.metadata["kernels_inferred"] = True
    stream = b.resource(ResourceKind.GPU_STREAM, device, COMPUTE_STREAM, f"gpu{device}/stream{COMPUTE_STREAM} (inferred)")
    new_res = [b.resource(r.kind, r.device, r.index, r.name) for r in graph.resources]
    comm_streams: dict[int, int] = {}
    issued_by = _issued(graph)
    issued = {t for ts in issued_by.values() for t in ts}

    ids = iter(range(int(graph.node_id.max(initial=0)) + 1, 1 << 62))

    def next_id() -> int:
        return next(ids)

    # ---- host timeline: one clock in ET order; a parent spans its children
    clock = 0.0
    start = np.zeros(n)
    end = np.zeros(n)
    node_of = [-1] * n
    kernels_of: dict[int, list[int]] = {}
    last_kernel = -1                     # latest kernel on the compute stream (new index)

    stacks: dict[int, list[int]] = {}   # per thread: ancestors not yet closed, innermost last
    prev_thread = -1

    def close_until(thread: int, p: int) -> None:
        st = stacks.setdefault(thread, [])
        while st and st[-1] != p:
            end[st.pop()] = clock

    def close_ops(thread: int) -> None:
        """The clock moves to another thread: this thread's open operators have returned (its annotations
        stay open: a ProfilerStep spans the autograd thread's work)."""
        st = stacks.get(thread, [])
        while st and kinds[st[-1]] != OpKind.ANNOTATION:
            end[st.pop()] = clock

    specs_of = _kernel_owners(graph, report, gpu_devices)
    def place_transfer(t: int, issuer: int) -> None:
        """A collective / send / recv on a GPU communication stream of its process group, after the
        compute stream's work issued before it (NCCL waits for it)."""
        r = graph.resources[res_of[t]]
        if r.kind != ResourceKind.GPU_STREAM:
            report.collectives_moved += 1
        if r.index not in comm_streams:
            index = r.index if r.index >= COMM_STREAM_BASE else COMM_STREAM_BASE + len(comm_streams)
            comm_streams[r.index] = b.resource(ResourceKind.GPU_STREAM, device, index, f"gpu{device}/comm {r.name}")
        tn = b.add_node(graph.name[t], int(graph.node_type[t]), kinds[t], comm_streams[r.index], clock, 0.0, -1,
                        int(graph.node_id[t]), dict(graph.attrs.get(t) or {}))
        node_of[t] = tn
        if issuer >= 0:
            b.add_dep(issuer, tn, EdgeKind.COLLECTIVE)
        if last_kernel >= 0:
            b.add_dep(last_kernel, tn, EdgeKind.CROSS_STREAM)

    warm_gemms = _gemm_shapes_in_every_step(graph, specs_of)
    for i in range(n):
        k = kinds[i]
        if res_of[i] in gpu_res or k in (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV):
            if i not in issued:
                place_transfer(i, -1)   # no issuer recorded: it runs where the ET has it
            continue   # the others follow their issuer
        p = parent[i]
        th = res_of[i]
        if th != prev_thread and prev_thread >= 0:
            close_ops(prev_thread)
        prev_thread = th
        close_until(th, p if p >= 0 else -2)
        if (p < 0 or kinds[p] == OpKind.ANNOTATION) and k != OpKind.ANNOTATION:
            clock += host.python_us   # one Python call per top-level op
        start[i] = clock
        ni = b.add_node(graph.name[i], int(graph.node_type[i]), k, new_res[res_of[i]], clock, 0.0,
                        node_of[p] if p >= 0 else -1, int(graph.node_id[i]), dict(graph.attrs.get(i) or {}))
        node_of[i] = ni
        stacks.setdefault(th, []).append(i)
        if k == OpKind.CPU_OP:
            report.ops += 1
            clock += host.op_us
            specs = specs_of[i]
            for spec in specs:
                key = _gemm_key(spec)
                if key is not None and key not in warm_gemms:
                    clock += host.new_gemm_shape_us   # first GEMM of this shape: cuBLAS searches an algorithm
                    warm_gemms.add(key)
                    report.new_gemm_shapes += 1
                # the runtime call under the op (as Kineto records it) launches the kernel
                ln = b.add_node("cudaLaunchKernel" if _gpu_kind(spec) == OpKind.KERNEL else "cudaMemcpyAsync",
                                NodeType.COMP_NODE, int(OpKind.LAUNCH), new_res[th], clock, host.launch_us, ni,
                                next_id())
                clock += host.launch_us
                kn = b.add_node(spec.name, NodeType.COMP_NODE, _gpu_kind(spec), stream, clock, 0.0, -1, next_id(),
                                dict(spec.attrs, inferred=True, launched_by=int(graph.node_id[i])))
                b.add_dep(ln, kn, EdgeKind.LAUNCH)
                kernels_of.setdefault(i, []).append(kn)
                last_kernel = kn
            on_gpu = report.cpu_trace or bool(set((graph.attrs.get(i) or {}).get("tensor_devices") or ()) & gpu_devices)
            if last_kernel >= 0 and ((_SYNCS.search(graph.name[i].lower()) and on_gpu)
                                     or any(s.attrs.get("host_waits") for s in specs)):
                # the host reads a GPU value: it waits for the stream (cudaStreamSynchronize)
                sn_ = b.add_node("cudaStreamSynchronize", NodeType.COMP_NODE, int(OpKind.SYNC), new_res[th], clock,
                                 0.0, ni, next_id())
                b.add_dep(last_kernel, sn_, EdgeKind.SYNC)
        for t in issued_by.get(i, []):   # the collectives this node issues follow it
            place_transfer(t, ni)
    for th in list(stacks):
        close_until(th, -2)

    # ---- dependencies of the original graph (data, sync to waits, inter-thread) between kept nodes
    for dst in range(n):
        if node_of[dst] < 0:
            continue
        for j in range(int(graph.dep_ptr[dst]), int(graph.dep_ptr[dst + 1])):
            src = int(graph.dep_src[j])
            if node_of[src] >= 0 and int(graph.dep_kind[j]) != EdgeKind.COLLECTIVE:
                b.add_dep(node_of[src], node_of[dst], int(graph.dep_kind[j]))
    # a wait on a collective holds the host (its SYNC edge above), so later kernels follow the collective

    durations = b.durations
    starts = b.starts
    for i in range(n):
        if node_of[i] >= 0 and not (res_of[i] in gpu_res or kinds[i] in (OpKind.COLLECTIVE, OpKind.SEND, OpKind.RECV)):
            starts[node_of[i]] = float(start[i])
            durations[node_of[i]] = float(max(end[i] - start[i], 0.0))

    # ---- steps: a ProfilerStep ends when the kernels launched inside it have finished
    for s in graph.steps:
        if s.node < 0 or node_of[s.node] < 0:
            continue
        sn = node_of[s.node]
        lo, hi = start[s.node], end[s.node]
        last = -1
        for i, ks in kernels_of.items():
            if lo <= start[i] <= hi:
                last = max(last, ks[-1])
        if last >= 0:
            b.add_dep(last, sn, EdgeKind.SYNC)
        b.add_step(s.name, sn, float(lo), 0.0)
    if not b.steps:
        b.add_step("step", -1, 0.0, 0.0)
    report.kernels = sum(report.kernels_by_class.values())
    b.metadata["et_inference"] = report.to_json()
    out = b.build()
    return out, report


def _conv_kernels(low: str, tens: list[list[int]], out_shapes: list, dtype: str) -> list[KernelSpec] | None:
    """A convolution as the implicit GEMM cuDNN runs (M = N*Ho*Wo output pixels, N = C_out / groups, K =
    C_in / groups * kernel window, one GEMM per group). The backward runs the input gradient (dgrad) and
    the weight gradient (wgrad) as two GEMMs with the forward's multiply-adds each, those its outputs ask
    for (an empty output shape: not computed), and the bias gradient as a reduction of grad_output."""
    backward = "backward" in low
    if backward:   # (grad_output, input, weight, ...)
        if len(tens) < 3 or not (len(tens[0]) == len(tens[1]) == len(tens[2]) >= 3):
            return None
        out, x, w = tens[0], tens[1], tens[2]
    else:          # (input, weight, ...) -> output
        o = out_shapes[0] if out_shapes and isinstance(out_shapes[0], (list, tuple)) else []
        if len(tens) < 2 or len(tens[0]) < 3 or len(tens[1]) != len(tens[0]) or len(o) != len(tens[0]):
            return None
        x, w, out = tens[0], tens[1], list(o)
    groups = max(1, x[1] // max(w[1], 1))
    pixels = out[0] * _numel(out[2:])
    c_out_g, window = max(1, w[0] // groups), w[1] * _numel(w[2:])
    # fp32 convolutions run on TF32 tensor cores where the GPU has them: PyTorch's
    # torch.backends.cudnn.allow_tf32 defaults to True (unlike matmuls' allow_tf32, False since 1.12)
    conv = {"op": "gemm", "dtype": "tf32" if dtype == "fp32" else dtype, "batch": groups, "conv": True}
    if not backward:
        return [KernelSpec("conv_fwd", dict(conv, m=pixels, n=c_out_g, k=window))]
    wanted = [bool(isinstance(sh, (list, tuple)) and len(sh)) for sh in (list(out_shapes) + [[]] * 3)[:3]]
    specs = []
    if wanted[0]:
        specs.append(KernelSpec("conv_dgrad", dict(conv, m=pixels, n=w[1], k=c_out_g * _numel(w[2:]))))
    if wanted[1]:
        specs.append(KernelSpec("conv_wgrad", dict(conv, m=c_out_g, n=window, k=pixels)))
    if wanted[2]:
        e = DTYPE_BYTES.get(dtype, 4)
        specs.append(KernelSpec("conv_bgrad", {"op": "reduction", "dtype": dtype, "bytes": float(_numel(out) * e)}))
    return specs


def _operand_layout(name: str, a: dict) -> str:
    """The strides of a GEMM's two matrix operands (addmm / baddbmm: after the bias), as the ET records them:
    with the shapes they give each operand's transposition and leading dimension, which cuBLAS's algorithm
    choice depends on ('' when the ET records no strides)."""
    shapes, types, strides = arg_list(a, "input_shapes"), arg_list(a, "input_types"), arg_list(a, "input_strides")
    mats = [st for sh, t, st in zip(shapes, types, strides)
            if "Tensor(" in str(t) and "GenericList" not in str(t) and isinstance(sh, (list, tuple)) and sh
            and isinstance(st, (list, tuple))]
    first = 1 if name.split("::")[-1] in ("addmm", "_addmm_activation", "baddbmm") else 0
    return ";".join(str(st) for st in mats[first:first + 2])


def _gemm_key(spec: KernelSpec) -> tuple | None:
    """What cuBLAS keys its algorithm search on: the problem and the operands' layout. A GEMM of a known
    (m, n, k) with other transposes or leading dimensions is searched anew: in the H100 MoE traces such
    GEMMs cost the host as much as unseen shapes (median 369 us against 92 us for a repeated layout)."""
    a = spec.attrs
    if a.get("op") != "gemm" or a.get("conv"):   # cuDNN picks convolution algorithms its own way
        return None
    return (a.get("dtype"), a.get("m"), a.get("n"), a.get("k"), a.get("batch", 1), a.get("layout", ""))


def _gemm_shapes_in_every_step(graph: ExecutionGraph, specs_of: list[list[KernelSpec]]) -> set[tuple]:
    """GEMM shapes that every recorded step runs: static shapes, searched during the warm-up steps that ran
    before the trace. A trace with fewer than two steps cannot tell static shapes from data-dependent
    ones, so all of its shapes count as warm (no search cost assumed)."""
    bounds = sorted(s.node for s in graph.steps if s.node >= 0)
    all_keys = [{_gemm_key(sp) for sp in specs} - {None} for specs in specs_of]
    if len(bounds) < 2:
        return set().union(*all_keys)
    per_step = []
    for lo, hi in zip(bounds, bounds[1:] + [len(specs_of)]):
        per_step.append(set().union(*all_keys[lo:hi]))
    return set.intersection(*per_step)


def _gpu_kind(spec: KernelSpec) -> int:
    op = spec.attrs.get("op")
    return int(OpKind.MEMCPY if op == "memcpy" else OpKind.MEMSET if op == "memset" else OpKind.KERNEL)


# Kernel classes an op keeps whatever other ops its implementation calls (see the module docstring); not
# index_select, which CUDA runs as a gather (its child then holds the kernel)
_OWN_KERNEL_CLASSES = ("gemm", "attention", "norm", "softmax", "embedding")
_COMPILED = re.compile(r"^## Call CompiledFxGraph")   # Inductor's record_function around a compiled graph call


def _op_specs(graph: ExecutionGraph, i: int, gpu_devices: set[str]) -> list[KernelSpec] | None:
    """op_kernels for node i, [] for host work in a CUDA run and ops without tensors."""
    a = graph.attrs.get(i) or {}
    check_tensor_shapes(graph, i, a)
    devs = set(a.get("tensor_devices") or ())
    if gpu_devices and devs and not (devs & gpu_devices):
        return []   # an op on host tensors in a CUDA run: CPU work
    if not devs and not a.get("input_shapes") and not a.get("output_shapes"):
        return []   # no tensors at all (python functions, autograd bookkeeping)
    return op_kernels(graph.name[i], a)


def _has_class(specs: list[KernelSpec] | None, classes: tuple[str, ...]) -> bool:
    return bool(specs) and any(sp.attrs.get("op") in classes for sp in specs)


def _keeps_own_kernels(name: str, specs: list[KernelSpec] | None) -> bool:
    return _has_class(specs, _OWN_KERNEL_CLASSES) and not name.endswith("::index_select")


def _kernel_owners(graph: ExecutionGraph, report: InferenceReport, gpu_devices: set[str]) -> list[list[KernelSpec]]:
    """The kernels each node launches, by the ownership rules of the module docstring. Computed bottom-up
    (children follow their parents in ET order), then the subtrees an op replaces are cleared."""
    n = len(graph)
    kinds, parent = graph.kind.tolist(), graph.parent.tolist()
    own_specs: list[list[KernelSpec] | None] = [None] * n
    below = [False] * n            # a descendant launches kernels
    owner_below = [False] * n      # ... of a class its ancestors leave to it
    launches = [False] * n
    replaces = [False] * n
    for i in range(n - 1, -1, -1):
        if _COMPILED.search(graph.name[i]):
            report.compiled_regions += 1
        keeps = False                  # launches kernels of a class its ancestors leave to it
        if kinds[i] == OpKind.CPU_OP and (not below[i] or not owner_below[i]):
            own_specs[i] = specs = _op_specs(graph, i, gpu_devices)
            keeps = _keeps_own_kernels(graph.name[i], specs)
            if not below[i]:
                launches[i] = True
            elif _has_class(specs, ("optimizer",)):
                launches[i] = replaces[i] = True
            elif keeps:
                launches[i] = True
                replaces[i] = report.cpu_trace
        p = parent[i]
        if p >= 0:
            below[p] = below[p] or below[i] or (launches[i] and bool(own_specs[i]))
            owner_below[p] = owner_below[p] or owner_below[i] or (launches[i] and keeps)
    specs_of: list[list[KernelSpec]] = [[] for _ in range(n)]
    under_replacer = [False] * n
    for i in range(n):
        p = parent[i]
        under_replacer[i] = p >= 0 and (under_replacer[p] or replaces[p])
        if not launches[i] or under_replacer[i]:
            continue
        if own_specs[i] is None:
            report.uninferred[graph.name[i]] += 1
        elif own_specs[i]:
            specs_of[i] = own_specs[i]
            report.launching_ops += 1
            for sp in own_specs[i]:
                report.kernels_by_class[str(sp.attrs.get("op"))] += 1
    return specs_of


def _issued(graph: ExecutionGraph) -> dict[int, list[int]]:
    """{issuer: [communication nodes it issues]} from the COLLECTIVE edges."""
    got: dict[int, list[int]] = {}
    dst = np.repeat(np.arange(len(graph)), np.diff(graph.dep_ptr))
    m = graph.dep_kind == EdgeKind.COLLECTIVE
    for s, d in zip(graph.dep_src[m].tolist(), dst[m].tolist()):
        got.setdefault(int(s), []).append(int(d))
    return got
