"""Bad input found by the fuzzing passes of sessions 36-37: work a typo would stretch to hours is refused
up front with the flag named."""
from __future__ import annotations

import pytest

from tests.test_hardening_sixth_pass import one_line_error
from tests.test_hardening_third_pass import cli

SEARCH = ("whatif", "parallelism", "--model", "llama3-8b", "--gpus", 16, "--seq-len", 4096, "--global-batch", 64,
          "--search")


@pytest.mark.parametrize("flag", ["--top-k", "--max-plans"])
def test_a_search_that_would_simulate_more_than_a_thousand_plans_is_refused(capsys, flag):
    """Each plan --top-k names is a full estimate (~0.1 s): 100,000 ran for hours before it was capped."""
    one_line_error(capsys, cli(*SEARCH, flag, 100_000), "--top-k (--max-plans) must be between 1 and 1,000",
                   "got 100000")


def test_a_sweep_search_axis_of_more_than_a_thousand_plans_is_refused(tmp_path, capsys):
    spec = tmp_path / "big.toml"
    spec.write_text('[scenario]\nwhatif = "parallelism"\nmodel = "llama3-8b"\nhardware = "h100-sxm"\n'
                    'plan = { seq_len = 4096, global_batch = 64 }\n'
                    '[[axes]]\nsearch = { gpus = [16], max_plans = 5000 }\n')
    assert cli("sweep", spec, "-o", tmp_path / "s.parquet", "--workers", 1) == 2
    err = capsys.readouterr().err
    assert "big.toml" in err and "search.max_plans must be an integer in [1, 1,000]" in err and "5000" in err
    assert not (tmp_path / "s.parquet").exists()
