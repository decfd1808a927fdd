"""Bad input found by a fuzzing pass over model mode from an ET, CPU Kineto traces and the published-training
check suites: each is a one-line error naming the file (exit 2), never a hang, a traceback, a NaN that
passes, or a step time of 1e76 us; corrupt-but-readable steps are not averaged in as 0 ms."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.inputs import load_graphs
from lumos_sim.cli import main
from lumos_sim.replay_run import run_replay

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "tests" / "data" / "cpu_models" / "cnn"


def _cnn_et(tmp_path: Path, edit) -> str:
    """The CNN fixture's ET with `edit(nodes)` applied, written as a new file."""
    doc = json.loads(gzip.decompress((CNN / "host.0.json.gz").read_bytes()))
    edit(doc["nodes"])
    out = tmp_path / "host.0.json.gz"
    out.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return str(out)


def _first(nodes, name):
    return next(n for n in nodes if n["name"] == name)


def test_a_tensor_larger_than_any_gpu_is_refused_naming_the_node(tmp_path, capsys):
    def huge(nodes):
        _first(nodes, "aten::mm")["inputs"]["shapes"][0] = [10 ** 7, 10 ** 7]   # 1e14 elements
    path = _cnn_et(tmp_path, huge)
    rc = main(["replay", "--et", path, "--timing", "model", "--hardware", "h100-sxm"])
    err = capsys.readouterr().err
    assert rc == 2 and path in err and "aten::mm" in err and "1e+14 elements" in err


def test_a_ctrl_deps_cycle_is_refused():
    def cycle(nodes):
        a, b = nodes[10], nodes[11]
        a["ctrl_deps"], b["ctrl_deps"] = b["id"], a["id"]
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = _cnn_et(Path(d), cycle)
        with pytest.raises(TraceInputError, match="its own ancestor"):
            load_graphs([], et_pattern=path)


def test_an_empty_step_anywhere_is_not_a_step_and_an_et_without_operators_is_refused(tmp_path):
    def empty_first_step(nodes):
        step = _first(nodes, "ProfilerStep#2")["id"]
        inside, grown = {step}, True
        while grown:                          # the first step's ops, at any depth, are dropped
            before = len(inside)
            inside.update(n["id"] for n in nodes if n.get("ctrl_deps") in inside)
            grown = len(inside) > before
        nodes[:] = [n for n in nodes if n["id"] == step or n["id"] not in inside]
    graph = load_graphs([], et_pattern=_cnn_et(tmp_path, empty_first_step))[0]
    assert [s.name for s in graph.steps] == ["ProfilerStep#3", "ProfilerStep#4"]
    assert all(s.predicted_us > 0 for s in run_replay([graph], "model", "h100-sxm").steps)

    def no_operators(nodes):
        nodes[:] = [n for n in nodes if n["name"].startswith(("[pytorch", "ProfilerStep"))]
    with pytest.raises(TraceInputError, match="records no operator"):
        load_graphs([], et_pattern=_cnn_et(tmp_path, no_operators))


def test_a_cpu_kineto_trace_whose_ops_do_not_link_to_the_et_is_refused_naming_the_et(tmp_path, capsys):
    doc = json.loads(gzip.decompress((CNN / "device.0.json.gz").read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "cpu_op"]
    kineto = tmp_path / "device.0.json.gz"
    kineto.write_bytes(gzip.compress(json.dumps(doc).encode()))
    et = str(CNN / "host.0.json.gz")
    rc = main(["replay", str(kineto), "--et", et, "--timing", "model", "--hardware", "h100-sxm"])
    err = capsys.readouterr().err
    assert rc == 2 and "could not be linked" in err and et in err


HEADER = ("source,release,model,gpu,gpus,precision,tp,pp,cp,vp,ep,etp,mbs,gbs,seq,recompute,fsdp,"
          "published_tflops,published_tokens_per_gpu,notes")
GOOD = "s,NeMo 25.09,LLAMA3_8B,H100,8,FP8,1,1,1,1,1,,1,128,8192,,0,725,14079,"


@pytest.mark.parametrize("column, value, problem", [
    ("published_tokens_per_gpu", "nan", "is not a finite number > 0"),
    ("published_tokens_per_gpu", "-5", "is not a finite number > 0"),
    ("tp", "0", "is not a whole number >= 1"),
    ("gpus", "eight", "is not a whole number >= 1"),
    ("gpus", "8.5", "is not a whole number >= 1"),
])
def test_a_malformed_published_row_is_bad_input_naming_file_row_and_column(tmp_path, capsys, column, value, problem):
    cells = GOOD.split(",")
    cells[HEADER.split(",").index(column)] = value
    (tmp_path / "rows.csv").write_text(HEADER + "\n" + ",".join(cells) + "\n")
    (tmp_path / "suite.toml").write_text('[suite]\nname = "s"\n\n[[case]]\nname = "c"\nkind = "published_training"\n'
                                         'csv = "rows.csv"\n')
    rc = main(["check", str(tmp_path / "suite.toml")])
    err = capsys.readouterr().err
    assert rc == 2 and "rows.csv" in err and f"row 0: {column} '{value}' {problem}" in err


def test_whatif_json_names_every_plan_setting(capsys):
    """A JSON consumer must tell a HybridEP plan from an all-to-all one (and see ETP, the FP8 recipe, ...)."""
    rc = main(["whatif", "parallelism", "--json", "--model", "qwen3-30b-a3b", "--gpus", "16", "--ep", "16",
               "--moe-a2a", "hybridep", "--seq-len", "4096", "--global-batch", "64"])
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert rc == 0 and plan["moe_a2a"] == "hybridep" and plan["etp"] == 1 and plan["ep"] == 16
    assert plan["micro_batches"] == 4 and plan["sequence_parallel"] is False


def test_a_malformed_et_field_is_named_in_words_not_as_a_python_exception(tmp_path, capsys):
    def schema_as_list(nodes):
        for n in nodes:
            for a in n.get("attrs", []):
                if a.get("name") == "op_schema":
                    a["value"] = ["not", "a", "string"]
    path = _cnn_et(tmp_path, schema_as_list)
    rc = main(["replay", "--et", path, "--timing", "model", "--hardware", "h100-sxm"])
    err = capsys.readouterr().err
    assert rc == 2 and path in err and "a field of the wrong type" in err and "TypeError" not in err


def _step_ops(nodes, step_name="ProfilerStep#2"):
    step = _first(nodes, step_name)
    return [n for n in nodes if n.get("ctrl_deps") == step["id"]]


def _replay_steps(path):
    return [s.predicted_us for s in run_replay(load_graphs([], et_pattern=path), "model", "h100-sxm").steps]


@pytest.mark.parametrize("link", ["absent", "itself", "a later op"])
def test_an_op_whose_parent_link_leads_nowhere_stays_in_its_step_with_a_warning(tmp_path, caplog, link):
    """An op naming a parent id absent from the trace, itself, or an op that started after it was made a
    top-level op outside every ProfilerStep: its time silently left the step (model mode on a 3-layer MLP ET:
    2.1 ms instead of 3.8 ms). ET ids are assigned as ops start, so it goes back under the step whose ids hold
    it -- the step time is the unedited trace's (less, for an absent parent, that parent's own host time) --
    and the trace is named in a warning."""
    def orphan(nodes):
        victim = max(_step_ops(nodes), key=lambda n: n["id"])     # the step's last top-level op (optimizer)
        if link == "absent":      # its own op is missing (a truncated or edited file): its children point at it
            nodes.remove(victim)
            return
        later = _step_ops(nodes, "ProfilerStep#3")[0]              # no descendant of the victim: no cycle
        victim["ctrl_deps"] = victim["id"] if link == "itself" else later["id"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    clean = _replay_steps(_cnn_et(tmp_path / "a", lambda nodes: None))
    path = _cnn_et(tmp_path / "b", orphan)
    assert _replay_steps(path) == pytest.approx(clean, rel=0.02 if link == "absent" else 1e-9)
    warned = [r.getMessage() for r in caplog.records if "parent that is not an earlier op" in r.getMessage()]
    assert len(warned) == 1 and path in warned[0] and "under the ProfilerStep" in warned[0]


def test_ops_whose_absent_parent_lies_outside_their_step_stay_where_they_are(tmp_path, caplog):
    """An absent parent that started before the steps (a record_function around the training loop, still
    open when the ET stopped) enclosed them: the steps keep their times. One that started after a step (the
    last step, still open when the ET stopped, is not written) took its ops out of that step: they do not
    join the step before. An op of another thread is not put under the main thread's step."""
    def enclosed(nodes):
        for n in nodes:
            if n["name"].startswith("ProfilerStep#"):
                n["ctrl_deps"] = 2                   # an id below the first step's, absent from the trace
        nodes[:] = [n for n in nodes if n["id"] != 2]

    def unwritten_last_step(nodes):
        nodes.remove(_first(nodes, "ProfilerStep#4"))

    def other_thread(nodes):
        victim = max(_step_ops(nodes), key=lambda n: n["id"])
        tid = next(a for a in victim["attrs"] if a["name"] == "tid")
        tid["value"] += 1                            # the autograd thread's number
        victim["ctrl_deps"] = victim["id"]
    for d in ("clean", "enclosed", "unwritten", "thread"):
        (tmp_path / d).mkdir()
    clean = _replay_steps(_cnn_et(tmp_path / "clean", lambda nodes: None))
    assert _replay_steps(_cnn_et(tmp_path / "enclosed", enclosed)) == pytest.approx(clean, rel=1e-9)
    assert _replay_steps(_cnn_et(tmp_path / "unwritten", unwritten_last_step)) == pytest.approx(clean[:2], rel=1e-9)
    g = load_graphs([], et_pattern=_cnn_et(tmp_path / "thread", other_thread))[0]
    assert "orphan_ops" not in g.metadata
    assert not [r for r in caplog.records if "parent that is not an earlier op" in r.getMessage()]
