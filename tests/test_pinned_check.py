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


def _fitted_on_case_traces(case) -> bool:
    """Whether the case's preset was calibrated on the case's own traces (its [calibration] traces name the
    trace files, or the folders holding them)."""
    from replay.hardware.config import get_hardware, load_hardware_file

    if not case.hardware:
        return False
    hw = load_hardware_file(case.hardware) if str(case.hardware).endswith(".toml") else get_hardware(case.hardware)
    if hw.calibration is None:
        return False
    labels = {t.split("#")[0] for t in hw.calibration.traces}
    paths = [p for p in [*case.inputs, case.et, case.kineto] if p]
    return any(Path(p).name in labels or Path(p).parent.name in labels for p in paths)


def test_suites_mark_exactly_the_cases_whose_preset_fitted_their_traces_in_sample():
    """A case is in-sample exactly when its calibrated preset was fitted on its traces (the preset's own
    [calibration] provenance says so); the held-out and ET-only H100 suites hold none."""
    for path in ("tests/data/h100/suite.toml", "tests/accuracy/model_a100.toml", "tests/data/h100/heldout/suite.toml",
                 "tests/data/h100/et_only_suite.toml"):
        _, cases = load_suite(ROOT / path)
        for c in cases:
            assert c.in_sample == _fitted_on_case_traces(c), (path, c.name)
    _, held = load_suite(ROOT / "tests/data/h100/heldout/suite.toml")
    assert len(held) == 2 and not any(c.in_sample for c in held)
    assert all(c.hardware == "h100-sxm" and c.timing == "model" for c in held)