"""Failure models as data: rates from observations, shares by cause, rescaling, loading and bad input.

References (rates counted by hand):
- rate per 1,000 node-days = interruptions / (nodes x days) x 1,000 (estimators/failures/model.py).
- Llama 3 405B (Dubey et al. 2024, sec. 3.3.4, Table 5): 419 interruptions on 16,384 GPUs (2,048 nodes of 8)
  in 54 days: 419 / (2,048 x 54) x 1,000 = 3.7887 per 1,000 node-days; faulty GPUs 148 of the 419.
- FT-HSDP (Salpekar et al. 2026): 80 failures a day on 98,000 GPUs (12,250 nodes): 6.5306 per 1,000 node-days.
"""
from __future__ import annotations

import pytest

from chakra_schema.errors import TraceInputError
from estimators.failures.model import (FailureComponent, FailureModel, failure_model_from_dict, get_failure_model,
                                       list_failure_models, load_failure_model_file)

LLAMA3_RATE = 419 / (2048 * 54) * 1000


def _obs(**kw):
    obs = {"gpus": 64, "gpus_per_node": 8, "days": 10, "interruptions": 4}      # 8 nodes x 10 days: 50 / 1,000
    obs.update(kw)
    return obs


# ---------------------------------------------------------------------- presets
def test_llama3_preset_rate_is_419_over_2048_nodes_and_54_days_and_gpus_take_148_of_them():
    m = get_failure_model("llama3-405b")
    assert m.rate_per_1000_node_days == pytest.approx(LLAMA3_RATE, rel=1e-12)
    comps = {c.name: c for c in m.components}
    assert comps["gpu"].rate_per_1000_node_days == pytest.approx(LLAMA3_RATE * 148 / 419, rel=1e-12)
    assert comps["software"].scope == "job" and comps["switch_cable"].nodes == 2 and comps["gpu"].scope == "node"
    assert m.distribution == "exponential" and m.name == "llama3-405b"
    assert m.path.endswith("llama3-405b.toml") and "observation" in m.sources
    assert m.description.startswith("Llama 3 405B")


def test_ft_hsdp_preset_rate_is_80_failures_a_day_on_12250_nodes():
    m = get_failure_model("ft-hsdp-100k")
    assert m.rate_per_1000_node_days == pytest.approx(80 / 12250 * 1000, rel=1e-12)
    assert [c.name for c in m.components] == ["node"]


def test_presets_are_listed_by_name():
    assert list_failure_models() == ["ft-hsdp-100k", "llama3-405b"]


# ---------------------------------------------------------------------- from a table
def test_components_by_count_share_the_observed_rate():
    """4 interruptions over 8 nodes x 10 days = 50 per 1,000 node-days; counts 3 : 1 -> 37.5 and 12.5."""
    m = failure_model_from_dict({"observation": _obs(), "components": {"a": {"count": 3}, "b": {"count": 1}}})
    assert [c.rate_per_1000_node_days for c in m.components] == [37.5, 12.5]
    assert m.rate_per_1000_node_days == 50.0
    assert m.name == "custom" and m.distribution == "exponential" and m.description == "" and m.sources == {}
    assert m.path is None


def test_an_explicit_job_rate_is_shared_by_count():
    m = failure_model_from_dict({"rate_per_1000_node_days": 6.0, "name": "x", "distribution": "weibull",
                                 "description": "d", "sources": {"k": "v"},
                                 "components": {"a": {"count": 1}, "b": {"count": 2, "scope": "job"},
                                                "c": {"count": 3, "nodes": 4}}})
    assert [c.rate_per_1000_node_days for c in m.components] == [1.0, 2.0, 3.0]
    assert [(c.scope, c.nodes) for c in m.components] == [("node", 1), ("job", 1), ("node", 4)]
    assert (m.name, m.distribution, m.description, m.sources) == ("x", "weibull", "d", {"k": "v"})


def test_components_with_their_own_rates_need_no_observation():
    m = failure_model_from_dict({"components": {"a": {"rate_per_1000_node_days": 1.5},
                                                "b": {"rate_per_1000_node_days": 2}}})
    assert [c.rate_per_1000_node_days for c in m.components] == [1.5, 2.0]
    assert m.rate_per_1000_node_days == 3.5


def test_counts_that_are_all_zero_give_zero_rates():
    m = failure_model_from_dict({"observation": _obs(), "components": {"a": {"count": 0}, "b": {"count": 0}}})
    assert [c.rate_per_1000_node_days for c in m.components] == [0.0, 0.0]


def test_a_count_beside_an_own_rate_shares_the_observed_rate_by_the_counts():
    """Only the counted components share the job rate (50): a's own 7.0 is kept, b (count 2) gets 50."""
    m = failure_model_from_dict({"observation": _obs(), "components": {"a": {"rate_per_1000_node_days": 7.0},
                                                                       "b": {"count": 2}}})
    assert [c.rate_per_1000_node_days for c in m.components] == [7.0, 50.0]


def test_a_model_file_is_named_after_its_file(tmp_path):
    p = tmp_path / "cluster-a.toml"
    p.write_text('[observation]\ngpus = 64\ngpus_per_node = 8\ndays = 10\ninterruptions = 4\n'
                 '[components.gpu]\ncount = 1\n')
    for m in (load_failure_model_file(p), get_failure_model(str(p))):
        assert m.name == "cluster-a" and m.path == str(p) and m.rate_per_1000_node_days == 50.0


# ---------------------------------------------------------------------- rescaling
def test_with_rate_keeps_the_mix_of_causes():
    m = FailureModel("m", (FailureComponent("a", 3.0), FailureComponent("b", 1.0, "job", 1)))
    s = m.with_rate(8.0)
    assert [c.rate_per_1000_node_days for c in s.components] == [6.0, 2.0]
    assert [(c.name, c.scope) for c in s.components] == [("a", "node"), ("b", "job")]
    assert s.name == "m"


def test_with_rate_of_a_zero_rate_model_shares_it_equally():
    m = FailureModel("m", (FailureComponent("a", 0.0), FailureComponent("b", 0.0), FailureComponent("c", 0.0),
                           FailureComponent("d", 0.0)))
    assert [c.rate_per_1000_node_days for c in m.with_rate(8.0).components] == [2.0, 2.0, 2.0, 2.0]


# ---------------------------------------------------------------------- bad input, one line each
@pytest.mark.parametrize("kw, message", [
    ({"rate_per_1000_node_days": -1.0}, r"^failure component 'x': rate must be >= 0, got -1.0$"),
    ({"rate_per_1000_node_days": float("nan")}, r"^failure component 'x': rate must be >= 0, got nan$"),
    ({"rate_per_1000_node_days": 1.0, "scope": "rack"},
     r"^failure component 'x': scope must be one of node, job, got 'rack'$"),
    ({"rate_per_1000_node_days": 1.0, "nodes": 0}, r"^failure component 'x': nodes must be an integer >= 1, got 0$"),
    ({"rate_per_1000_node_days": 1.0, "nodes": True}, r"nodes must be an integer >= 1, got True$"),
    ({"rate_per_1000_node_days": 1.0, "nodes": 2.0}, r"nodes must be an integer >= 1, got 2.0$"),
])
def test_a_bad_component_is_a_one_line_error(kw, message):
    with pytest.raises(TraceInputError, match=message):
        FailureComponent("x", **kw)


def test_a_component_of_zero_rate_and_one_node_is_fine():
    c = FailureComponent("x", 0.0, "job", 1)
    assert (c.rate_per_1000_node_days, c.scope, c.nodes) == (0.0, "job", 1)


def test_a_model_needs_components_and_a_known_distribution():
    with pytest.raises(TraceInputError, match=r"^failure model 'm' has no components$"):
        FailureModel("m", ())
    with pytest.raises(TraceInputError, match=r"^distribution must be one of exponential, weibull, got 'gamma'$"):
        FailureModel("m", (FailureComponent("a", 1.0),), distribution="gamma")


@pytest.mark.parametrize("data, message", [
    ({"components": {}}, r"^a failure model needs a \[components\] table \(one sub-table per cause\)$"),
    ({"components": 3}, r"needs a \[components\] table"),
    ({"observation": _obs(), "components": {"a": 3}}, r"^components.a must be a table$"),
    ({"observation": _obs(), "components": {"a": {"scope": "node"}}},
     r"^components.a needs 'count' or 'rate_per_1000_node_days'$"),
    ({"components": {"a": {"count": 1}}},
     r"^give rate_per_1000_node_days or an \[observation\] table \(gpus, gpus_per_node, days, interruptions\)$"),
    ({"observation": _obs(gpus=0), "components": {"a": {"count": 1}}},
     r"^observation gpus, gpus_per_node and days must be > 0$"),
    ({"observation": _obs(gpus_per_node=0), "components": {"a": {"count": 1}}}, r"must be > 0$"),
    ({"observation": _obs(days=0), "components": {"a": {"count": 1}}}, r"must be > 0$"),
    ({"observation": _obs(interruptions=-1), "components": {"a": {"count": 1}}},
     r"^observation.interruptions must be a number >= 0, got -1$"),
    ({"observation": _obs(days="x"), "components": {"a": {"count": 1}}},
     r"^observation.days must be a number >= 0, got 'x'$"),
    ({"observation": _obs(days=True), "components": {"a": {"count": 1}}}, r"got True$"),
    ({"observation": _obs(), "components": {"a": {"count": -2}}}, r"^components.a.count must be a number >= 0"),
    ({"components": {"a": {"rate_per_1000_node_days": "x"}}},
     r"^components.a.rate_per_1000_node_days must be a number >= 0, got 'x'$"),
    ({"rate_per_1000_node_days": -3, "components": {"a": {"count": 1}}},
     r"^rate_per_1000_node_days must be a number >= 0, got -3$"),
    ({"observation": _obs(), "components": {"a": {"count": 1, "colour": 1}}}, r"components\.a\.colour"),
    ({"observation": {**_obs(), "hours": 1}, "components": {"a": {"count": 1}}}, r"observation\.hours"),
    ({"colour": 1, "components": {"a": {"rate_per_1000_node_days": 1}}}, r"colour"),
])
def test_a_bad_failure_model_table_is_a_one_line_error(data, message):
    with pytest.raises(TraceInputError, match=message):
        failure_model_from_dict(data)


def test_a_bad_failure_model_file_names_itself(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[components.gpu]\ncount = 1\n")
    with pytest.raises(TraceInputError) as e:
        load_failure_model_file(p)
    assert e.value.path == str(p) and e.value.problem.startswith("give rate_per_1000_node_days")
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_an_unknown_model_name_lists_the_presets():
    with pytest.raises(TraceInputError, match=r"^unknown failure model 'nope' \(presets: ft-hsdp-100k, llama3-405b; "
                                              r"or give a TOML path\)$"):
        get_failure_model("nope")


def test_a_missing_model_file_is_read_as_a_path(tmp_path):
    for key in (str(tmp_path / "none.toml"), "dir/none"):
        with pytest.raises(TraceInputError) as e:
            get_failure_model(key)
        assert "unknown failure model" not in str(e.value)


@pytest.mark.parametrize("data", [
    {"components": {}},
    {"observation": _obs(), "components": {"a": 3}},
    {"observation": _obs(), "components": {"a": {"scope": "node"}}},
    {"components": {"a": {"count": 1}}},
    {"observation": _obs(gpus=0), "components": {"a": {"count": 1}}},
    {"observation": _obs(days="x"), "components": {"a": {"count": 1}}},
    {"observation": _obs(), "components": {"a": {"count": -2}}},
    {"components": {"a": {"rate_per_1000_node_days": "x"}}},
    {"rate_per_1000_node_days": -3, "components": {"a": {"count": 1}}},
    {"observation": _obs(), "components": {"a": {"count": 1, "colour": 1}}},
    {"observation": {**_obs(), "hours": 1}, "components": {"a": {"count": 1}}},
    {"colour": 1, "components": {"a": {"rate_per_1000_node_days": 1}}},
])
def test_a_bad_table_names_the_file_it_came_from(data):
    with pytest.raises(TraceInputError) as e:
        failure_model_from_dict(data, "cluster.toml")
    assert e.value.path == "cluster.toml"


def test_a_bad_model_names_its_file():
    with pytest.raises(TraceInputError) as e:
        FailureModel("m", (), path="m.toml")
    assert e.value.path == "m.toml"
    with pytest.raises(TraceInputError) as e:
        FailureModel("m", (FailureComponent("a", 1.0),), distribution="gamma", path="m.toml")
    assert e.value.path == "m.toml"


def test_an_observation_of_one_gpu_on_one_gpu_nodes_is_valid():
    """1 GPU, 1 GPU a node, 1 day, 2 interruptions: 2 / (1 x 1) x 1,000 = 2,000 per 1,000 node-days."""
    m = failure_model_from_dict({"observation": _obs(gpus=1, gpus_per_node=1, days=1, interruptions=2),
                                 "components": {"a": {"count": 1}}})
    assert m.rate_per_1000_node_days == 2000.0


def test_with_rate_of_a_model_below_one_per_1000_node_days_keeps_the_mix():
    m = FailureModel("m", (FailureComponent("a", 0.6), FailureComponent("b", 0.2)))
    assert [c.rate_per_1000_node_days for c in m.with_rate(8.0).components] == pytest.approx([6.0, 2.0], rel=1e-15)


def test_a_missing_model_file_named_without_a_folder_is_read_as_a_file():
    with pytest.raises(TraceInputError, match=r"^none\.toml: failure model file not found$"):
        get_failure_model("none.toml")
