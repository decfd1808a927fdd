"""MoE all-to-all bytes on a routing small enough to count by hand (never the evaluator's own output).

Definition (DeepSeek-V3 / Megatron-core token dispatcher, and the module docstring of
estimators/moe/evaluate.py): every (token, expert) pair whose expert lives on another GPU sends the
token's hidden vector there (dispatch, `dispatch_bytes` per element) and gets the expert's output back
(combine, `combine_bytes` per element); pairs served on the token's own GPU never leave it.
"""
from __future__ import annotations

import numpy as np
import pytest

from estimators.moe.evaluate import ExpertShape, Layout, LayerTimer, evaluate_placements
from estimators.moe.placement import Placement
from estimators.moe.routing import ArraySource

# EP4 on 2 nodes of 2 GPUs, 4 experts (expert e on GPU e), 2 tokens per GPU, top-2, one MoE layer.
# token t sits on GPU t // 2.
ROUTING = [[0, 1],   # t0 on g0: e0 local, e1 -> g1 (same node)
           [2, 3],   # t1 on g0: -> g2, -> g3 (other node, both)
           [1, 2],   # t2 on g1: e1 local, -> g2 (other node)
           [0, 3],   # t3 on g1: -> g0 (same node), -> g3 (other node)
           [2, 0],   # t4 on g2: e2 local, -> g0 (other node)
           [3, 1],   # t5 on g2: -> g3 (same node), -> g1 (other node)
           [3, 2],   # t6 on g3: e3 local, -> g2 (same node)
           [0, 2]]   # t7 on g3: -> g0 (other node), -> g2 (same node)
# counted from the comments: 16 pairs, 4 local, 12 leave their GPU, 7 of them cross nodes
PAIRS = np.array([[1, 1, 1, 1],
                  [1, 1, 1, 1],
                  [1, 1, 1, 1],
                  [1, 0, 2, 1]])
HIDDEN = 16


def _evaluate(dispatch_bytes: int = 2, combine_bytes: int = 2):
    src = ArraySource(np.asarray(ROUTING, dtype=np.int32)[:, None, :])
    layout = Layout(gpus=4, gpus_per_node=2, tokens_per_gpu=2)
    shape = ExpertShape(hidden=HIDDEN, expert_ffn=32, gated=True, shared_experts=0, experts=4,
                        dispatch_bytes=dispatch_bytes, combine_bytes=combine_bytes)
    contiguous = Placement("contiguous", np.array([[0, 1, 2, 3]]), gpus=4, gpus_per_node=2, experts=4)
    timer = LayerTimer(shape, "h100-sxm", layout)
    return evaluate_placements(src, 0, 8, layout, 4, [contiguous], timer)[0], timer


def test_all_to_all_bytes_are_off_gpu_pairs_times_hidden_times_dispatch_plus_combine_bytes():
    """Pins 12 off-GPU pairs x 16 hidden x (2 B dispatch + 2 B combine) = 768 B per batch, 7 x 64 = 448 B
    of them between nodes; with FP8 dispatch (1 B) 12 x 16 x 3 = 576 B."""
    cost, _ = _evaluate()
    assert PAIRS.sum() == 16 and PAIRS.trace() == 4
    assert cost.a2a_bytes[0] == 12 * HIDDEN * (2 + 2) == 768
    assert cost.a2a_bytes_inter_node[0] == 7 * HIDDEN * 4 == 448
    fp8, _ = _evaluate(dispatch_bytes=1)
    assert fp8.a2a_bytes[0] == 12 * HIDDEN * 3 == 576


def test_all_to_all_times_are_costed_on_the_hand_counted_pair_matrix():
    """The dispatch is timed on PAIRS x hidden x 2 B (rank g -> rank h), the combine on its transpose."""
    cost, timer = _evaluate()
    assert np.array_equal(cost.pair_tokens[0, 0], PAIRS)
    ranks = [0, 1, 2, 3]
    assert cost.dispatch_us[0] == pytest.approx(timer.network.all_to_all_v_us(PAIRS * HIDDEN * 2.0, ranks))
    assert cost.combine_us[0] == pytest.approx(timer.network.all_to_all_v_us(PAIRS.T * HIDDEN * 2.0, ranks))
