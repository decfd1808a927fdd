"""Property tests (hypothesis) of the MoE routing readers (.npy, parquet, JSON lines, gzip) and the sweep /
suite TOML loaders: valid routing reads back exactly in every format, and arbitrary input ends in a
result or a one-line TraceInputError naming the file, never another exception. Seeded (the same
examples every run) like tests/test_fuzz_properties.py; LUMOS_SIM_FUZZ_EXAMPLES / LUMOS_SIM_FUZZ_RANDOM
widen it into a campaign."""
from __future__ import annotations

import gzip
import json
import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chakra_schema.errors import TraceInputError
from estimators.moe.routing import load_routing

FAST = settings(max_examples=int(os.environ.get("LUMOS_SIM_FUZZ_EXAMPLES", "40")), deadline=None,
                derandomize=os.environ.get("LUMOS_SIM_FUZZ_RANDOM") != "1",
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                         st.text(max_size=5))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(st.text(max_size=4), inner, max_size=4)),
                           max_leaves=12)
routing_keys = st.sampled_from(["layer", "token_idx", "experts", "gating_probs", "domain", "step", "rank", "topk",
                                "num_tokens", "top_indices"])
records = st.lists(st.dictionaries(routing_keys, json_values, max_size=7), min_size=1, max_size=6)


def _read_all(path) -> np.ndarray:
    src = load_routing(path)
    return np.concatenate([ids for _, ids in src.chunks(0, None, 3)])


def _clean(folder):
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    return folder


@FAST
@given(ids=st.integers(1, 6).flatmap(lambda t: st.integers(1, 3).flatmap(lambda layers: st.integers(1, 4).flatmap(
    lambda k: st.lists(st.lists(st.lists(st.integers(0, 2**31 - 1), min_size=k, max_size=k),
                                min_size=layers, max_size=layers), min_size=t, max_size=t)))))
def test_valid_routing_reads_back_exactly_in_every_format(tmp_path, ids):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    arr = np.asarray(ids, dtype=np.int64)
    tokens, layers, k = arr.shape
    d = _clean(tmp_path / "r")
    np.save(d / "r.npy", arr.astype(np.int32))
    assert np.array_equal(_read_all(d / "r.npy"), arr)
    for layer in range(layers):
        pq.write_table(pa.table({"indices": pa.array(arr[:, layer].tolist(), pa.list_(pa.int64()))}),
                       d / f"layer_{layer}.parquet")
    assert np.array_equal(_read_all(d), arr)
    lines = [json.dumps({"layer": layer, "token_idx": t, "experts": arr[t, layer].tolist()})
             for t in range(tokens) for layer in range(layers)]
    (d / "t.jsonl").write_text("\n\n".join(lines))
    (d / "t.jsonl.gz").write_bytes(gzip.compress("\n".join(lines).encode()))
    assert np.array_equal(_read_all(d / "t.jsonl"), arr)
    assert np.array_equal(_read_all(d / "t.jsonl.gz"), arr)
    meg = [json.dumps({"step": 0, "rank": 0, "layer": layer, "topk": k, "num_tokens": tokens,
                       "top_indices": arr[:, layer].tolist()}) for layer in range(layers)]
    (d / "m.jsonl").write_text("\n".join(meg))
    assert np.array_equal(_read_all(d / "m.jsonl"), arr)


@FAST
@given(recs=records, gz=st.booleans())
def test_routing_json_lines_of_arbitrary_records_are_read_or_refused_in_one_line(tmp_path, recs, gz):
    path = _clean(tmp_path / "j") / ("r.jsonl.gz" if gz else "r.jsonl")
    text = "\n".join(json.dumps(r) for r in recs).encode()
    path.write_bytes(gzip.compress(text) if gz else text)
    try:
        _read_all(path)
    except TraceInputError as e:
        assert str(path) in str(e) and "\n" not in str(e)


@FAST
@given(data=st.binary(max_size=300), fmt=st.sampled_from(["npy", "parquet", "jsonl", "jsonl.gz"]))
def test_routing_readers_on_arbitrary_bytes_raise_only_trace_input_error(tmp_path, data, fmt):
    d = _clean(tmp_path / "b")
    path = d / ("layer_0.parquet" if fmt == "parquet" else f"r.{fmt}")
    if fmt == "npy":   # a real header, so the reader gets past the magic
        data = b"\x93NUMPY\x01\x00" + len(data).to_bytes(2, "little") + data
    path.write_bytes(data)
    try:
        _read_all(d if fmt == "parquet" else path)
    except TraceInputError as e:
        assert "\n" not in str(e)


@FAST
@given(shape=st.tuples(st.integers(0, 10**18), st.integers(0, 10**12), st.integers(0, 10**6)),
       descr=st.sampled_from(["<i2", "<i4", "<i8", "<u8", "<f4", "|b1", "O"]))
def test_npy_headers_claiming_anything_are_checked_before_allocating(tmp_path, shape, descr):
    path = _clean(tmp_path / "n") / "r.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": shape})
        f.write(b"\x01" * 96)
    try:
        _read_all(path)
    except TraceInputError as e:
        assert str(path) in str(e)


toml_keys = st.sampled_from(["scenario", "sweep", "axes", "grid", "zip", "list", "search", "gpus", "max_plans",
                             "label", "model", "hardware", "plan", "plan.tp", "plan.micro_batch", "whatif", "name",
                             "case", "suite", "inputs", "tolerance", "steps", "ranks", "measured_ms", "timing"])
toml_scalars = st.one_of(st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False, allow_infinity=False),
                         st.sampled_from(["llama3-8b", "h100-sxm", "parallelism", "bogus", "trace", "{suite_dir}/x"]))
toml_docs = st.recursive(st.dictionaries(toml_keys, toml_scalars, max_size=4),
                         lambda inner: st.dictionaries(toml_keys, st.one_of(toml_scalars, inner, st.lists(inner, max_size=3),
                                                                           st.lists(toml_scalars, max_size=3)),
                                                       max_size=4), max_leaves=16)


def _toml(doc: dict) -> str:
    """A dict as TOML with inline tables (no writer dependency)."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{ " + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + " }"
    return "\n".join(f"{json.dumps(k)} = {value(v)}" for k, v in doc.items()) + "\n"


@FAST
@given(doc=toml_docs)
def test_sweep_and_suite_loaders_on_arbitrary_toml_raise_only_trace_input_error(tmp_path, doc):
    from lumos_sim.check import load_suite
    from lumos_sim.sweeps import SearchAxis, load_spec
    path = _clean(tmp_path / "t") / "spec.toml"
    path.write_text(_toml(doc))
    try:
        spec = load_spec(path)
        spec.count()
        if not any(isinstance(a, SearchAxis) for a in spec.axes):
            for _, _p in zip(range(3), spec.iter_points()):
                pass
    except TraceInputError as e:
        assert "\n" not in str(e)
    try:
        load_suite(path)
    except TraceInputError as e:
        assert "\n" not in str(e)
