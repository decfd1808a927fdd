"""MoE routing inputs: every loader gives the same columnar form, bad traces are one clear error, and
synthetic routing has the structure it promises (skew, domains, prefill->decode, drift) and streams."""
from __future__ import annotations

import numpy as np
import orjson
import pytest

from chakra_schema.errors import TraceInputError
from estimators.moe.evaluate import Layout, aligned_chunks, fit_stats, source_gpus
from estimators.moe.routing import MaskedSource, check_against_model, check_ids, load_routing
from estimators.moe.synthetic import SyntheticSource, SyntheticSpec


def _all(src) -> np.ndarray:
    return np.concatenate([c for _, c in src.chunks(0, None, 7)])


def test_npy_routing_is_read_in_chunks(tmp_path):
    arr = np.random.default_rng(0).integers(0, 16, (50, 3, 2)).astype(np.int16)
    np.save(tmp_path / "r.npy", arr)
    src = load_routing(tmp_path / "r.npy")
    assert (src.tokens, src.layers, src.top_k) == (50, 3, 2)
    assert np.array_equal(_all(src), arr)
    assert np.array_equal(next(src.chunks(13, 20))[1], arr[13:20])


def test_npy_of_the_wrong_shape_or_type_is_rejected(tmp_path):
    np.save(tmp_path / "flat.npy", np.zeros((4, 8), np.int16))
    np.save(tmp_path / "float.npy", np.zeros((4, 2, 2), np.float32))
    with pytest.raises(TraceInputError, match="must be \\[tokens, layers, top_k\\]"):
        load_routing(tmp_path / "flat.npy")
    with pytest.raises(TraceInputError, match="C-ordered integers"):
        load_routing(tmp_path / "float.npy")


def test_parquet_layer_files_align_rows_and_carry_domains(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 8, (40, 2, 2))
    for layer in range(2):
        cols = {"indices": pa.array(arr[:, layer].tolist()), "scores": pa.array(np.full((40, 2), 0.5).tolist())}
        if layer == 0:
            cols["domain"] = pa.array(["code", "math"] * 20)
        pq.write_table(pa.table(cols), tmp_path / f"layer_{layer}.parquet", row_group_size=16)
    src = load_routing(tmp_path)
    assert np.array_equal(_all(src), arr)
    assert src.domain_names == ("code", "math") and src.domain.tolist()[:2] == [0, 1]


def test_parquet_with_ragged_top_k_is_rejected(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"indices": pa.array([[1, 2], [3]])}), tmp_path / "layer_0.parquet")
    with pytest.raises(TraceInputError, match="ragged top-k"):
        _all(load_routing(tmp_path))


def _jsonl(path, records):
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in records))
    return path


def test_megatron_routing_lines_stack_rank_blocks_by_layer(tmp_path):
    recs = [{"step": 0, "layer": layer, "rank": rank, "num_tokens": 2, "topk": 2,
             "top_indices": [[rank, layer], [rank + 2, layer + 4]]} for rank in (0, 1) for layer in (3, 5)]
    src = load_routing(_jsonl(tmp_path / "m.jsonl", recs))
    ids = _all(src)
    assert ids.shape == (4, 2, 2)
    assert ids[2].tolist() == [[1, 3], [1, 5]]     # rank 1's first token, layers 3 and 5


def test_megatron_routing_with_ragged_top_k_is_rejected(tmp_path):
    recs = [{"layer": 0, "num_tokens": 2, "topk": 2, "top_indices": [[1, 2], [3]]}]
    with pytest.raises(TraceInputError, match="ragged top-k"):
        load_routing(_jsonl(tmp_path / "m.jsonl", recs))


def test_token_records_keep_gate_probabilities_and_domains(tmp_path):
    recs = [{"layer": l, "token_idx": t, "experts": [t, l + 4], "gating_probs": [0.6, 0.4],
             "domain": "code" if t else "chat"} for t in range(3) for l in range(2)]
    src = load_routing(_jsonl(tmp_path / "t.jsonl", recs))
    assert _all(src)[2].tolist() == [[2, 4], [2, 5]]
    assert src.scores.shape == (3, 2, 2) and src.domain_names == ("chat", "code")


def test_token_records_missing_a_layer_are_rejected(tmp_path):
    recs = [{"layer": 0, "token_idx": 0, "experts": [1]}, {"layer": 1, "token_idx": 0, "experts": [1]},
            {"layer": 0, "token_idx": 1, "experts": [2]}]
    with pytest.raises(TraceInputError, match="no record for layer 1"):
        load_routing(_jsonl(tmp_path / "t.jsonl", recs))


def test_expert_ids_and_layer_count_are_checked_against_the_model():
    with pytest.raises(TraceInputError, match="expert id 300 at token 5"):
        ids = np.zeros((8, 2, 2), np.int32)
        ids[1, 1, 0] = 300
        check_ids(ids, 256, "r.npy", 4)
    src = SyntheticSource(SyntheticSpec(tokens=10, layers=3, experts=16, top_k=2))
    with pytest.raises(TraceInputError, match="3 MoE layers, the model has 58"):
        check_against_model(src, 16, 58, 2)


def test_synthetic_routing_is_seeded_and_independent_of_chunking():
    spec = SyntheticSpec(tokens=70000, layers=2, experts=32, top_k=4, clusters=8, seed=3)
    a = np.concatenate([c for _, c in SyntheticSource(spec).chunks(0, None, 5000)])
    b = np.concatenate([c for _, c in aligned_chunks(SyntheticSource(spec), 0, spec.tokens, 65536)])
    assert np.array_equal(a, b)
    assert (np.sort(a, axis=2)[:, :, 1:] != np.sort(a, axis=2)[:, :, :-1]).all()   # top-k distinct
    assert a.min() >= 0 and a.max() < 32


def test_synthetic_popular_experts_are_domain_specific_and_skewed():
    spec = SyntheticSpec(tokens=20000, layers=1, experts=64, top_k=4, clusters=8, domains=2, drift=0.0)
    src = SyntheticSource(spec)
    ids = _all(src)[:, 0]
    loads = [np.bincount(ids[src.domain == d].ravel(), minlength=64) for d in range(2)]
    top = [set(np.argsort(-l)[:8]) for l in loads]
    assert len(top[0] & top[1]) <= 4                 # different popular experts per domain
    assert max(loads[0]) > 3 * np.mean(loads[0])      # skewed


def test_synthetic_decode_routing_follows_the_prefill_routing_of_the_request():
    spec = SyntheticSpec(tokens=40000, layers=1, experts=64, top_k=4, clusters=8, domains=4, skew=0.0,
                         cluster_affinity=0.6, drift=0.0, request_tokens=100)
    src = SyntheticSource(spec)
    ids = _all(src)[:, 0]
    req = np.arange(spec.tokens) // spec.request_tokens

    def agreement(phase_a, phase_b):
        """Share of decode picks that hit the request's 8 most-used prefill experts."""
        hits = []
        for r in range(0, req.max(), 7):
            sel = req == r
            pre = np.bincount(ids[sel & (src.phase == phase_a)].ravel(), minlength=64)
            dec = ids[sel & (src.phase == phase_b)].ravel()
            hits.append(np.isin(dec, np.argsort(-pre)[:8]).mean())
        return float(np.mean(hits))
    assert agreement(0, 1) > 0.4                     # uniform routing would give 8/64 = 0.125


def test_synthetic_drift_moves_popularity_over_the_trace():
    def shift(drift):
        src = SyntheticSource(SyntheticSpec(tokens=40000, layers=1, experts=64, top_k=4, clusters=8, drift=drift))
        ids = _all(src)[:, 0]
        a, b = (np.bincount(x.ravel(), minlength=64) for x in (ids[:10000], ids[-10000:]))
        return np.abs(a / a.sum() - b / b.sum()).sum()
    assert shift(1.0) > 2 * shift(0.0)


def test_exactly_balanced_synthetic_routing_gives_every_rank_pair_the_same_count():
    spec = SyntheticSpec(tokens=4 * 64, layers=2, experts=16, top_k=4, balanced=1)
    stats = fit_stats(SyntheticSource(spec), 0, spec.tokens, Layout(4, 2, 64), 16, coactivation_tokens=0)
    assert (stats.load == stats.load[0, 0]).all()
    assert (stats.node_load == stats.node_load[0, 0, 0]).all()


def test_grouping_by_domain_keeps_each_domain_on_its_own_ranks():
    domain = np.repeat(np.array([1, 0, 1, 0]), 8).astype(np.int16)    # 32 tokens, one window on 4 ranks
    g = source_gpus(Layout(4, 2, 8, "domain"), domain)
    assert set(g[domain == 0]) == {0, 1} and set(g[domain == 1]) == {2, 3}
    assert source_gpus(Layout(4, 2, 8), domain).tolist() == np.repeat(np.arange(4), 8).tolist()


def test_masked_source_reads_only_the_kept_tokens():
    src = SyntheticSource(SyntheticSpec(tokens=1000, layers=1, experts=16, top_k=2, clusters=4, request_tokens=10))
    dec = MaskedSource(src, src.phase == 1)
    assert np.array_equal(np.concatenate([c for _, c in dec.chunks(0, None, 64)]), _all(src)[src.phase == 1])
    assert np.array_equal(next(dec.chunks(100, 110))[1], _all(src)[src.phase == 1][100:110])
