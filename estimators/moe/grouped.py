"""Node-limited (group-limited) routing over any routing source.

DeepSeek-V3 splits its 256 experts into 8 groups and lets a token pick its 8 experts from at most 4 groups
(HF `n_group` / `topk_group`; with the groups on nodes, a token reaches at most 4 nodes). `GroupLimitedSource`
imposes that on routing that does not already obey it (synthetic routing): per token and layer, the
`groups_per_token` groups holding most of its picks are kept (ties: the group picked first), and each pick
outside them moves to the expert with the same index inside a kept group (the first kept group where that
expert is not already picked). Picks inside kept groups are unchanged, so routing that already obeys the
limit passes through as it is.
"""
from __future__ import annotations

import numpy as np


BLOCK_ROWS = 1 << 17


def limit_groups(ids: np.ndarray, experts: int, groups: int, per_token: int) -> np.ndarray:
    """ids [..., k] expert ids -> the same shape with every row's experts from at most `per_token` groups."""
    if groups <= 1 or per_token >= groups:
        return ids
    flat = ids.reshape(-1, ids.shape[-1])
    out = np.empty_like(flat)
    for a in range(0, len(flat), BLOCK_ROWS):          # bounded temporaries
        out[a:a + BLOCK_ROWS] = _limit_rows(flat[a:a + BLOCK_ROWS], experts, groups, per_token)
    return out.reshape(ids.shape)


def _limit_rows(flat: np.ndarray, experts: int, groups: int, per_token: int) -> np.ndarray:
    k = flat.shape[1]
    rows = flat.astype(np.int64)
    size = experts // groups
    g = rows // size
    n = len(rows)
    count = np.zeros((n, groups), np.int64)
    np.add.at(count, (np.repeat(np.arange(n), k), g.ravel()), 1)
    first = np.full((n, groups), k, np.int64)
    np.minimum.at(first, (np.repeat(np.arange(n), k), g.ravel()), np.tile(np.arange(k), n))
    score = count * (k + 1) - first                   # most picks first, then the earliest picked
    keep = np.argsort(-score, axis=1, kind="stable")[:, :per_token]          # [n, per_token]
    kept = np.zeros((n, groups), bool)
    kept[np.arange(n)[:, None], keep] = True
    out = rows.copy()
    bad = ~kept[np.arange(n)[:, None], g]
    if not bad.any():
        return flat
    for j in range(k):                                  # positions in order, all rows at once
        pending = np.flatnonzero(bad[:, j])
        idx = rows[pending, j] % size
        for step in range(size):
            for c in range(per_token):
                if not len(pending):
                    break
                cand = keep[pending, c] * size + (idx + step) % size
                free = ~(out[pending] == cand[:, None]).any(1)
                out[pending[free], j] = cand[free]
                pending, idx = pending[~free], idx[~free]
            if not len(pending):
                break
    return out.astype(flat.dtype)


class GroupLimitedSource:
    """A `RoutingSource` whose chunks obey node-limited routing (see the module docstring)."""

    def __init__(self, src, experts: int, groups: int, per_token: int):
        self.src, self.experts, self.groups, self.per_token = src, experts, groups, per_token
        self.path = getattr(src, "path", "<routing>")
        for name in ("tokens", "layers", "top_k", "domain", "domain_names", "phase"):
            setattr(self, name, getattr(src, name))

    def chunks(self, start: int = 0, stop: int | None = None, size: int = 65536):
        for first, ids in self.src.chunks(start, stop, size):
            yield first, limit_groups(ids, self.experts, self.groups, self.per_token)
