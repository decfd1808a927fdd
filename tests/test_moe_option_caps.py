"""MoE what-if options that size the work (timed windows, sampled batch, synthetic tokens, GPUs per node) are
capped: a typo is a one-line error (exit 2), not an estimate that runs for hours or exhausts memory."""
from __future__ import annotations

import subprocess
import sys

import pytest

from chakra_schema.errors import TraceInputError
from estimators.moe.options import MAX_SAMPLED_WINDOW, MAX_SYNTHETIC_TOKENS, MAX_TIMED_WINDOWS, MoEOptions


@pytest.mark.parametrize("name,cap", [("timed_windows", MAX_TIMED_WINDOWS), ("sampled_window", MAX_SAMPLED_WINDOW),
                                      ("synthetic_tokens", MAX_SYNTHETIC_TOKENS)])
def test_sizing_options_above_their_cap_are_one_line_errors(name, cap):
    MoEOptions(**{name: cap})                       # the cap itself is allowed
    with pytest.raises(TraceInputError, match=f"moe.{name} must be at most {cap:,}"):
        MoEOptions(**{name: cap + 1})


def test_gpus_per_node_beyond_one_nvlink_domain_exits_2_with_one_line():
    p = subprocess.run([sys.executable, "-m", "lumos_sim", "whatif", "moe", "--model", "deepseek-v3", "--ep", "64",
                        "--gpus-per-node", "100000"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["lumos-sim whatif: error: --gpus-per-node must be at most 4,096, got 100000"]
