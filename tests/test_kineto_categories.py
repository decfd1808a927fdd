"""Kineto category names across profiler versions, and events the converter does not replay.

Older Kineto (PyTorch 1.x; e.g. HolisticTraceAnalysis' tests/data/trace_file_list/inference_rank_1.json.gz,
recorded 2022-10) names its categories "Runtime", "Kernel", "Memcpy", "Memset", "Operator" and spells
the runtime call's external id in lower case ("external id"). Traces from other devices (MTIA's
`mtia_ccp_events` / `mtia_runtime`) or from CUPTI's range profiler (`cuda_profiler_range`: kernels
serialized to read counters) hold events that are not CUDA/HIP timeline work: they are counted and named
in a warning, never dropped silently."""
from __future__ import annotations

import json
import logging

import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.pytorch.kineto import canonical_category, load_kineto
from lumos_sim.cli import main as cli_main


def _trace(tmp_path, events, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    return path


def _old_style_events():
    """One launch (Runtime) and its kernel (Kernel) linked by correlation, as PyTorch 1.x wrote them, plus
    a memcpy and an operator, inside a 100 us profiler step."""
    return [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000, "dur": 100,
         "args": {}},
        {"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1005, "dur": 20,
         "args": {"external id": 7}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1010, "dur": 6,
         "args": {"cbid": 211, "correlation": 11, "external id": 7}},
        {"ph": "X", "cat": "Kernel", "name": "add_kernel", "pid": 0, "tid": 7, "ts": 1020, "dur": 50,
         "args": {"device": 0, "stream": 7, "correlation": 11, "external id": 7}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy DtoH", "pid": 0, "tid": 7, "ts": 1075, "dur": 5,
         "args": {"device": 0, "stream": 7, "correlation": 12}},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
         "ts": 990, "dur": 200, "args": {}},
    ]


def test_category_names_of_older_kineto_and_any_case_read_as_the_current_ones():
    assert canonical_category("Kernel") == "kernel"
    assert canonical_category("Runtime") == "cuda_runtime"
    assert canonical_category("Memcpy") == "gpu_memcpy"
    assert canonical_category("Memset") == "gpu_memset"
    assert canonical_category("Operator") == "cpu_op"
    assert canonical_category("CUDA_RUNTIME") == "cuda_runtime"
    assert canonical_category(None) is None


def test_older_kineto_trace_is_read_with_its_kernels_launches_and_external_ids(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    t = load_kineto(_trace(tmp_path, _old_style_events()))
    assert t.gpu_name == ["add_kernel", "Memcpy DtoH"]
    assert t.gpu_cat == ["kernel", "gpu_memcpy"]
    assert t.rt_name == ["cudaLaunchKernel"] and t.rt_corr == [11] and t.rt_ext == [7]
    assert [h.cat for h in t.host_ops] == ["user_annotation", "cpu_op"]
    assert t.host_ops[1].external_id == 7
    assert t.dropped == {} and "not replayed" not in caplog.text     # the profiler span is no work


def test_older_kineto_trace_converts_and_replays_its_recorded_step(tmp_path, capsys):
    path = _trace(tmp_path, _old_style_events())
    assert cli_main(["convert", "--kineto", str(path), "-o", str(tmp_path / "job")]) == 0
    capsys.readouterr()
    assert cli_main(["replay", str(tmp_path / "job"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_nodes"] == 5                    # step annotation, operator, launch, kernel, memcpy
    (step,) = out["steps"]
    assert step["measured_us"] == 100.0 and step["predicted_us"] == pytest.approx(100.0)
    assert step["breakdown"]["compute_us"] == pytest.approx(55.0)    # the 50 us kernel + the 5 us memcpy


def _foreign_events():
    return _old_style_events()[:4] + [
        {"ph": "X", "cat": "mtia_ccp_events", "name": "pe_exe", "pid": 17, "tid": 3910, "ts": 1030, "dur": 40,
         "args": {"stream": 112}},
        {"ph": "X", "cat": "mtia_ccp_events", "name": "dma_request", "pid": 17, "tid": 3672, "ts": 1031, "dur": 5,
         "args": {"stream": 105}},
        {"ph": "X", "cat": "cuda_profiler_range", "name": "gemm", "pid": 0, "tid": 0, "ts": 1040, "dur": 30,
         "args": {}},
        {"ph": "X", "cat": "python_function", "name": "train.py(10): step", "pid": 1, "tid": 1, "ts": 1001,
         "dur": 90, "args": {}},
    ]


def test_events_of_other_devices_and_range_profiling_are_counted_and_named_in_a_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    path = _trace(tmp_path, _foreign_events(), "mixed.json")
    t = load_kineto(path)
    assert t.dropped == {"mtia_ccp_events": 2, "cuda_profiler_range": 1}     # python frames are no work
    warning = [r.getMessage() for r in caplog.records if "not replayed" in r.getMessage()]
    assert len(warning) == 1
    assert "mixed.json" in warning[0]
    assert "2 events of category mtia_ccp_events" in warning[0] and "MTIA" in warning[0]
    assert "1 event of category cuda_profiler_range" in warning[0] and "range-profiler" in warning[0]


def test_convert_prints_the_warning_on_stderr_and_still_writes_the_graph(tmp_path, capsys):
    path = _trace(tmp_path, _foreign_events(), "mixed.json")
    assert cli_main(["convert", "--kineto", str(path), "-o", str(tmp_path / "job")]) == 0
    err = capsys.readouterr().err
    assert "mixed.json" in err and "not replayed" in err and "mtia_ccp_events" in err
    assert (tmp_path / "job.0.et").exists()


def test_a_trace_of_only_unreplayable_events_is_one_line_error_saying_what_it_holds(tmp_path):
    events = [e for e in _foreign_events() if e["cat"] in ("mtia_ccp_events", "cuda_profiler_range")]
    path = _trace(tmp_path, events, "only_mtia.json")
    with pytest.raises(TraceInputError) as exc:
        load_kineto(path)
    msg = str(exc.value)
    assert "only_mtia.json" in msg and "no host, runtime or GPU events" in msg
    assert "2 events of category mtia_ccp_events" in msg and "\n" not in msg


def test_profiler_steps_recorded_as_operators_by_pytorch_1_8_are_steps(tmp_path, capsys):
    # PyTorch 1.8/1.9 (kineto tb_plugin samples, e.g. resnet50_num_workers_0) recorded ProfilerStep#N in
    # the "Operator" category: each is still a step of its own
    events = []
    for k, t0 in enumerate((1000, 1200)):
        events += [
            {"ph": "X", "cat": "Operator", "name": f"ProfilerStep#{k + 5}", "pid": 1, "tid": 1, "ts": t0, "dur": 150,
             "args": {}},
            {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t0 + 10, "dur": 5,
             "args": {"correlation": 10 + k}},
            {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": 7, "ts": t0 + 20, "dur": 100,
             "args": {"device": 0, "stream": 7, "correlation": 10 + k}},
        ]
    path = _trace(tmp_path, events)
    assert cli_main(["convert", "--kineto", str(path), "-o", str(tmp_path / "job")]) == 0
    capsys.readouterr()
    assert cli_main(["replay", str(tmp_path / "job"), "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert [(s["name"], s["measured_us"]) for s in steps] == [("ProfilerStep#5", 150.0), ("ProfilerStep#6", 150.0)]
    assert all(s["predicted_us"] == pytest.approx(150.0) for s in steps)


def test_a_chrome_trace_that_is_a_bare_event_array_is_read(tmp_path):
    # the Chrome trace event format's array form (the 2020 kineto plugin samples were written so)
    path = tmp_path / "array.json"
    path.write_text(json.dumps(_old_style_events()))
    t = load_kineto(path)
    assert t.gpu_name == ["add_kernel", "Memcpy DtoH"] and t.rank is None
    for other in ("[1, 2, 3]", '[{"name": "gemm", "us": 10.5}]', "[]"):   # a list, but of no trace events
        path = tmp_path / "other.json"
        path.write_text(other)
        with pytest.raises(TraceInputError, match="not a Kineto trace"):
            load_kineto(path)
