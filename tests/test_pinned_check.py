"""`lumos-sim check`: cases whose traces fitted their preset (`in_sample = true`) are labelled in-sample
and not counted as accuracy; the held-out H100 suite has no in-sample case."""
from __future__ import annotations

from pathlib import Path

import pytest

from chakra_schema.errors import TraceInputError
from lumos_sim.check import CaseResult, CaseSpec, StepCheck, load_suite, print_results, results_json

ROOT = Path(__file__).resolve().parent.parent


def _result(name: str, in_sample: bool, predicted: float) -> CaseResult:
    case = CaseSpec(name=name, inputs=[], tolerance=0.05, in_sample=in_sample)
    return CaseResult("s", case, [StepCheck(0, "ProfilerStep#1", 100.0, predicted)])


def test_in_sample_cases_are_labelled_and_left_out_of_the_accuracy_count(capsys):
    results = [_result("held out", False, 103.0), _result("fitted", True, 100.0), _result("bad", False, 120.0)]
    doc = results_json(results)
    assert (doc["passed"], doc["failed"], doc["accuracy_passed"], doc["in_sample"]) == (2, 1, 1, 1)
    assert [c["in_sample"] for c in doc["cases"]] == [False, True, False]
    print_results(results)
    out = capsys.readouterr().out
    assert out.count("in-sample") == 2          # the case's note and its verdict


def test_in_sample_must_be_a_boolean(tmp_path):
    suite = tmp_path / "s.toml"
    suite.write_text('[[case]]\nname = "x"\ninputs = ["a.json"]\nin_sample = "yes"\n')
    with pytest.raises(TraceInputError, match="'in_sample' of case 'x' must be true or false"):
        load_suite(suite)


def test_suites_mark_exactly_the_calibrated_preset_cases_in_sample():
    """The calibrated presets were fitted on these suites' traces (their comments say so); the held-out
    H100 suite uses traces no fit has seen."""
    for path in (ROOT / "tests/data/h100/suite.toml", ROOT / "tests/accuracy/model_a100.toml"):
        _, cases = load_suite(path)
        for c in cases:
            assert c.in_sample == ("calibrated" in str(c.hardware)), c.name
    _, held = load_suite(ROOT / "tests/data/h100/heldout/suite.toml")
    assert len(held) == 2 and not any(c.in_sample for c in held)
    assert all("calibrated" in str(c.hardware) and c.timing == "model" for c in held)
