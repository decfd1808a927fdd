"""Record router top-k choices of a PyTorch MoE model into the parquet routing form.

`RoutingRecorder(model, top_k)` attaches a forward hook to every router of `model`: modules whose
qualified name matches `pattern` (default: a last name component `gate` or `router`, as in Megatron-core,
DeepSeek, Mixtral and Qwen MoE blocks). A router's output is its logits [..., experts] (the first
floating tensor when it returns a tuple); the hook takes softmax probabilities and their top-k. Routers
are MoE layers in module order; tokens are appended call by call, so rows align across layers when
every forward runs every layer. `save(directory)` writes `layer_<i>.parquet` files with list columns
`indices` (int16) and `scores` (float32), which `estimators.moe.routing.load_routing` reads.

torch and pyarrow are optional: imported only here.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from chakra_schema.errors import TraceInputError
from chakra_schema.safe_io import atomic_output

DEFAULT_PATTERN = r"(^|\.)(gate|router)$"


class RoutingRecorder:
    def __init__(self, model, top_k: int | None = None, pattern: str = DEFAULT_PATTERN):
        self.top_k = top_k
        self.routers = [(name, m) for name, m in model.named_modules() if name and re.search(pattern, name)]
        if not self.routers:
            raise TraceInputError(None, f"no router module matches /{pattern}/ (use --router-pattern)")
        if top_k is None:
            self.top_k = _find_top_k(model)
        self.indices: list[list[np.ndarray]] = [[] for _ in self.routers]
        self.scores: list[list[np.ndarray]] = [[] for _ in self.routers]
        self._handles = []

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.routers]

    def __enter__(self) -> "RoutingRecorder":
        for i, (_, module) in enumerate(self.routers):
            self._handles.append(module.register_forward_hook(self._hook(i)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, layer: int):
        import torch

        def hook(module, inputs, output):
            logits = output
            if isinstance(output, (tuple, list)):
                logits = next((t for t in output if torch.is_tensor(t) and t.is_floating_point()), None)
            if logits is None:
                return
            with torch.no_grad():
                probs = torch.softmax(logits.detach().float().reshape(-1, logits.shape[-1]), dim=-1)
                top = torch.topk(probs, self.top_k, dim=-1)
            self.indices[layer].append(top.indices.cpu().numpy().astype(np.int16))
            self.scores[layer].append(top.values.cpu().numpy().astype(np.float32))
        return hook

    def save(self, directory: str | os.PathLike) -> list[Path]:
        """Write one parquet file per router; rows must align across layers."""
        counts = {sum(len(a) for a in chunks) for chunks in self.indices}
        if counts == {0}:
            raise TraceInputError(Path(directory), "no router calls were recorded")
        if len(counts) != 1:
            raise TraceInputError(Path(directory), f"routers saw different token counts {sorted(counts)}: "
                                                   "rows would not align")
        return write_routing_parquet(directory, [np.concatenate(c) for c in self.indices],
                                     [np.concatenate(c) for c in self.scores], self.names, self.top_k)


def write_routing_parquet(directory: str | os.PathLike, indices: list[np.ndarray], scores: list[np.ndarray],
                          names: list[str], top_k: int) -> list[Path]:
    """`layer_<i>.parquet` per MoE layer: list columns `indices` (int16 expert ids) and `scores` (float32
    gate probabilities), [tokens, top_k] each, rows aligned across layers; metadata module name, top_k."""
    out = Path(directory)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise TraceInputError(out, "writing parquet routing needs pyarrow: pip install pyarrow") from None
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    k = top_k
    for i, name in enumerate(names):
        idx = np.asarray(indices[i], dtype=np.int16)
        sc = np.asarray(scores[i], dtype=np.float32)
        offsets = pa.array(np.arange(0, len(idx) * k + 1, k, dtype=np.int32))
        table = pa.table({"indices": pa.ListArray.from_arrays(offsets, pa.array(idx.reshape(-1))),
                          "scores": pa.ListArray.from_arrays(offsets, pa.array(sc.reshape(-1)))})
        table = table.replace_schema_metadata({"module": name, "top_k": str(k)})
        path = out / f"layer_{i:03d}.parquet"
        with atomic_output(path) as f:   # the shared writer: the user's umask, never half a file
            pq.write_table(table, f)
        paths.append(path)
    return paths


def _find_top_k(model) -> int:
    for m in model.modules():
        for attr in ("top_k", "num_experts_per_tok", "topk", "moe_top_k"):
            v = getattr(m, attr, None)
            if isinstance(v, int) and v > 0:
                return v
    raise TraceInputError(None, "cannot tell the router's top-k from the model: pass --top-k K")
