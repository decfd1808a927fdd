"""What-ifs that generate their ops from a model and a plan time them on the preset's roofline: kernel models
fitted on recorded kernels (the calibrated default h100-sxm) stay with recorded kernels."""
from __future__ import annotations

import pytest

from estimators.model_config import load_model
from estimators.parallelism.evaluate import predict
from estimators.parallelism.plan import ParallelPlan
from replay.hardware.config import for_generated_ops, get_hardware


def test_a_calibrated_preset_times_generated_ops_like_its_roofline():
    model = load_model("llama3-8b")
    plan = ParallelPlan(tp=2, pp=2, dp=2, seq_len=2048, global_batch=16)
    calibrated, roofline = get_hardware("h100-sxm"), get_hardware("h100-sxm-roofline")
    assert calibrated.kernel_models and calibrated.compute.sustained_tensor_fraction < 1.0
    assert predict(model, plan, calibrated).step_time_s == pytest.approx(predict(model, plan, roofline).step_time_s,
                                                                       rel=1e-9)


def test_generated_ops_keep_every_other_field_of_the_preset():
    import dataclasses
    hw = get_hardware("h100-sxm")
    faster_nic = dataclasses.replace(hw, network=dataclasses.replace(hw.network, nic_gbps=800.0))
    timed = for_generated_ops(faster_nic)
    assert timed.network.nic_gbps == 800.0 and not timed.kernel_models and timed.calibration is None
    assert timed.compute.sustained_tensor_fraction == get_hardware("h100-sxm-roofline").compute.sustained_tensor_fraction
