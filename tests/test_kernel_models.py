"""Kernel classification, fitted per-class kernel models, `lumos-sim calibrate`, honest cross-validation."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from chakra_schema.errors import TraceInputError
from chakra_schema.graph import OpKind
from lumos_sim.cli import main as cli_main
from replay.hardware import get_hardware
from replay.hardware.config import KernelClassModel
from replay.hardware.kernel_classes import classify_kernel, unclassified_report
from replay.hardware.kernel_models import (CONTENDED, ISOLATED, KernelSamples, class_model, communication_contention,
                                           communication_overlap, cross_validate, fit_class_models, fit_geometry,
                                           fit_launch_model, fit_roofline, geometry_estimate, geometry_time, gmae,
                                           kernel_family, kernel_variant, model_keys, predict, predict_all)


def test_classification_uses_the_launching_op_when_the_name_says_nothing():
    assert classify_kernel("void fbgemm_gpu::_offsets_range_cuda_kernel<long>(long)", "fb::offsets_range").cls \
        == "embedding"  # 'fbgemm' is not a GEMM
    assert classify_kernel("void bounds_check_indices_kernel<long>()", "fbgemm::bounds_check_indices").cls == "embedding"
    assert classify_kernel("void mystery_kernel()", "aten::sum").cls == "reduction"
    k = classify_kernel("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>()", "aten::mm")
    assert (k.cls, k.library, k.tf32, k.by_op) == ("gemm", "cutlass", True, False)
    assert classify_kernel("void splitKreduce_kernel<float>()", "aten::mm").split_k
    assert classify_kernel("triton_poi_fused_add_0", "").library == "triton"
    assert classify_kernel("void flash_fwd_kernel<Flash_fwd_kernel_traits<128> >()", "").library == "flash"


def test_unclassified_report_lists_what_no_class_covers():
    share, rows = unclassified_report([("void mystery_kernel()", "custom::op", 30.0),
                                       ("ampere_sgemm_128x64_nn", "aten::mm", 70.0)])
    assert share == pytest.approx(0.3)
    assert rows[0].name == "void mystery_kernel()" and rows[0].count == 1


def test_kernel_family_folds_digits_but_keeps_the_implementation():
    a = kernel_family("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float> >(at::native::ReduceOp<float>)")
    b = kernel_family("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float> >(at::native::ReduceOp<float>)")
    assert a == b and a.startswith("at::native::reduce_kernel<")
    assert kernel_family("ampere_sgemm_128x64_nn") != kernel_family("void at::native::reduce_kernel<1>()")


def test_roofline_fit_recovers_fixed_cost_and_efficiency():
    rng = np.random.default_rng(0)
    roof = np.geomspace(0.5, 500, 400)
    measured = (3.0 + roof / 0.6) * np.exp(rng.normal(0, 0.03, len(roof)))
    overhead, eff = fit_roofline(roof, measured)
    assert overhead == pytest.approx(3.0, rel=0.15) and eff == pytest.approx(0.6, rel=0.06)


def test_geometry_fit_recovers_slopes_and_stays_physical():
    rng = np.random.default_rng(1)
    grid = np.column_stack([rng.integers(1, 100, 300), rng.integers(1, 100, 300), np.ones(300)]).astype(float)
    threads = rng.choice([128.0, 256.0, 512.0], 300)
    smem = np.zeros(300)
    t = np.exp(0.5 + 0.7 * np.log(grid[:, 0]) + 0.3 * np.log(grid[:, 1]) + 0.2 * np.log(threads))
    g0, gx, gy, gz, gt, gs = fit_geometry(grid, threads, smem, t)
    assert (gx, gy, gt) == (pytest.approx(0.7, abs=0.02), pytest.approx(0.3, abs=0.02), pytest.approx(0.2, abs=0.05))
    # z and shared memory never moved: no slope to extrapolate with
    assert (gz, gs) == (0.0, 0.0)
    # one launch configuration only: no slopes at all
    one = fit_geometry(np.tile([8.0, 1.0, 1.0], (9, 1)), np.full(9, 128.0), np.zeros(9), np.full(9, 5.0))
    assert one[1:] == (0.0,) * 5 and one[0] == pytest.approx(np.log(5.0))


def test_launch_model_tells_grid_axes_and_shared_memory_apart():
    """cuDNN's layout transforms cost more per CTA along x than along z, and its 'singleread' batch norms
    take longer with more shared memory per CTA at the same grid: the product of the grid and the thread
    count alone cannot time either."""
    rng = np.random.default_rng(3)
    grid = np.column_stack([rng.choice([1.0, 7.0, 25.0, 98.0], 200), rng.choice([2.0, 8.0, 16.0], 200),
                            rng.choice([32.0, 256.0], 200)])
    smem = rng.choice([8336.0, 26768.0], 200)
    threads = np.full(200, 256.0)
    t = 0.05 * grid[:, 0] ** 0.9 * grid[:, 1] ** 0.9 * grid[:, 2] ** 0.4 * (1 + smem) ** 0.6
    fit = fit_launch_model(grid, threads, smem, t)
    assert len(fit) == 6 and gmae(geometry_time(fit, grid, threads, smem), t) < 0.02
    ctas_only = fit_launch_model(np.column_stack([grid.prod(axis=1), np.ones((200, 2))]), threads, np.zeros(200), t)
    assert gmae(geometry_time(ctas_only, grid, threads, smem), t) > 0.3
    # replay reads the same configuration from a kernel's attrs (Kineto's grid / block / shared memory)
    model = KernelClassModel(geometry=fit)
    est = geometry_estimate(model, {"grid": [7, 8, 32], "block": [256, 1, 1], "shared_memory": 8336})
    assert est.time_us == pytest.approx(float(geometry_time(fit, np.array([[7.0, 8.0, 32.0]]), np.array([256.0]),
                                                            np.array([8336.0]))[0]))
    assert geometry_estimate(model, {"grid": [7, 8, 32]}) is None  # no block recorded: no estimate
    # a one-CTA launch far below the fitted grids extrapolates to nanoseconds: it takes a kernel's least time
    tiny = geometry_estimate(model, {"grid": [1, 1, 1], "block": [128, 1, 1], "shared_memory": 0}, min_us=2.0)
    assert float(geometry_time(fit, np.array([[1.0, 1.0, 1.0]]), np.array([128.0]), np.array([0.0]))[0]) < 0.5
    assert tiny.time_us == 2.0


def _family(roof, grid, smem, measured, name="nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_TNT") -> KernelSamples:
    n = len(measured)
    return KernelSamples(trace=np.zeros(n, np.int64), step=np.arange(n) % 3, cls=np.full(n, "gemm", object),
                         dtype=np.full(n, "bf16", object), measured_us=np.asarray(measured, float),
                         roofline_us=np.asarray(roof, float), base_us=np.asarray(roof, float),
                         grid=np.asarray(grid, float), threads=np.full(n, 384.0), smem=np.asarray(smem, float),
                         name=np.full(n, name, object), tensor_fraction=np.full(n, np.nan),
                         contention=np.full(n, "", object), trace_names=["t"])


def test_shaped_kernels_keep_the_roofline_unless_the_launch_configuration_times_new_shapes_better():
    """A GEMM's work per CTA grows with K, which no grid shows: two shapes whose shared memory happens to
    differ 'explain' their times in sample, and a larger batch on the same grid then came out 4x too
    fast. Sort / segment kernels whose work is in the data (one shape, times 3x apart, following the
    grid) are the ones the launch configuration should time."""
    rng = np.random.default_rng(4)
    roof = np.repeat([157.0, 182.0], 15)
    smem = np.concatenate([np.full(15, 209060.0), rng.choice([221380.0, 225476.0, 229572.0], 15)])
    measured = 7e-4 * smem * np.exp(rng.normal(0, 0.01, 30))  # in sample the time follows the smem
    gemm = _family(roof, np.tile([2.0, 66.0, 1.0], (30, 1)), smem, measured)
    model = next(m for k, m in fit_class_models(gemm).items() if "/" in k)
    assert not model.shaped_by_geometry
    # 3.5x the work on the same grid and shared memory: the roofline scales it, the geometry would not
    bigger = _family([630.0], [[2.0, 66.0, 1.0]], [225476.0], [1.0])
    assert predict(model, bigger)[0] > 2.0 * measured[15:].mean()
    ctas = rng.choice([16.0, 48.0, 160.0], 30)
    data_dependent = _family(np.full(30, 5.0), np.column_stack([ctas, np.ones((30, 2))]), np.zeros(30),
                             2.0 + 0.1 * ctas, name="void cub::DeviceRadixSortOnesweepKernel<int>()")
    assert next(m for k, m in fit_class_models(data_dependent).items() if "/" in k).shaped_by_geometry


def test_presets_written_with_the_ctas_form_still_time_kernels():
    g0, g1, g2 = 0.5, 0.7, 0.2
    t = geometry_time((g0, g1, g2), np.array([[4.0, 2.0, 1.0]]), np.array([128.0]), np.array([0.0]))
    assert t[0] == pytest.approx(np.exp(g0 + g1 * np.log(8.0) + g2 * np.log(128.0)))


def _samples(n_steps=3, per_step=40) -> KernelSamples:
    rng = np.random.default_rng(2)
    n = n_steps * per_step
    roof = np.geomspace(1, 100, n)
    return KernelSamples(trace=np.zeros(n, np.int64), step=np.repeat(np.arange(n_steps), per_step),
                         cls=np.full(n, "elementwise", object), dtype=np.full(n, "fp32", object),
                         measured_us=2.0 + roof / 0.5 * np.exp(rng.normal(0, 0.02, n)), roofline_us=roof,
                         base_us=roof, grid=np.zeros((n, 3)), threads=np.zeros(n), smem=np.zeros(n),
                         name=np.full(n, "void at::native::vectorized_elementwise_kernel<4>()", object),
                         tensor_fraction=np.full(n, np.nan), contention=np.full(n, "", object),
                         trace_names=["t"])


def test_cross_validation_never_fits_on_the_kernels_it_tests():
    s = _samples()
    seen = []

    def spy_fit(train):
        seen.append(set(np.round(train.measured_us, 9).tolist()))
        from replay.hardware.kernel_models import fit_class_models
        return fit_class_models(train)

    folds = [s.step == k for k in range(3)]
    rows = cross_validate(s, folds, fit=spy_fit)
    for k, train in enumerate(seen):
        assert not train & set(np.round(s.measured_us[s.step == k], 9).tolist())
    (row,) = rows
    assert row.kernels == len(s) and row.after_gmae < 0.05 < row.before_gmae  # the fit beats the roofline


def test_calibrated_class_model_changes_model_estimates(tmp_path):
    f = tmp_path / "cal.toml"
    f.write_text('name = "cal"\nextends = "a100-sxm-40gb"\n[kernel_models."elementwise"]\n'
                 'overhead_us = 4.0\nefficiency = 0.5\ngeometry = []\n')
    from replay.hardware.compute import ComputeModel
    base = ComputeModel("a100-sxm-40gb").op_estimate({"op": "elementwise", "bytes": 1e6})
    cal = ComputeModel(str(f)).op_estimate({"op": "elementwise", "bytes": 1e6})
    assert cal.time_us == pytest.approx(4.0 + base.memory_us / 0.5)
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\nextends = "a100-sxm-40gb"\n[kernel_models."gemm"]\noverhead_us = -1.0\n')
    with pytest.raises(TraceInputError, match="kernel_models.gemm"):
        get_hardware(str(bad))


def test_predict_all_prefers_the_family_model():
    s = _samples(1, 10)
    models = {"elementwise": KernelClassModel(overhead_us=1.0),
              "elementwise/" + kernel_family(s.name[0]): KernelClassModel(overhead_us=100.0)}
    assert np.all(predict_all(models, s) >= 100.0)


def test_calibrate_cli_writes_a_preset_that_extends_the_base(shared_traces, tmp_path, capsys):
    out = tmp_path / "my-a100.toml"
    trace = shared_traces / "hta" / "trace_diff_control_control.json.gz"
    assert cli_main(["calibrate", str(trace), "--hardware", "a100-sxm-40gb", "-o", str(out)]) == 0
    text = out.read_text()
    assert 'extends = "a100-sxm-40gb"' in text and "trace_diff_control_control.json.gz" in text
    hw = get_hardware(str(out))
    assert hw.calibration.kernels > 5000 and hw.calibration.base == "a100-sxm-40gb"
    assert "gemm_tf32" in hw.kernel_models and hw.kernel_models["gemm_tf32"].kernels > 1000
    assert all(k in hw.sources for k in (f"kernel_models.{m}" for m in hw.kernel_models))
    assert "by step" in capsys.readouterr().out
    # the preset's sustained tensor fraction is this measurement, not a hand-chosen number
    assert hw.compute.sustained_tensor_fraction == pytest.approx(
        get_hardware("a100-sxm-40gb").compute.sustained_tensor_fraction, abs=0.01)
    assert cli_main(["calibrate", str(trace), "--hardware", "a100-sxm-40gb", "-o", str(tmp_path / "x.txt")]) == 2
    assert cli_main(["calibrate", str(trace), "--hardware", "h100-sxm", "-o", str(tmp_path / "h.toml")]) == 2
    assert "recorded on A100" in capsys.readouterr().err and not (tmp_path / "h.toml").exists()


def _stream_graph(kernels):
    """A one-GPU graph from (name, stream, start_us, duration_us, kind) tuples."""
    from chakra_schema.graph import GraphBuilder, NodeType, ResourceKind

    b = GraphBuilder()
    for name, stream, start, dur, kind in kernels:
        r = b.resource(ResourceKind.GPU_STREAM, 0, stream)
        b.add_node(name, NodeType.COMP_NODE if kind != OpKind.COLLECTIVE else NodeType.COMM_COLL_NODE, kind, r,
                   start, dur)
    return b.build()


def test_communication_overlap_is_the_share_of_a_kernel_run_under_nccl():
    g = _stream_graph([("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", 20, 10.0, 10.0, OpKind.COLLECTIVE),
                       ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", 20, 18.0, 4.0, OpKind.COLLECTIVE),
                       ("void at::native::vectorized_elementwise_kernel<4>()", 7, 0.0, 5.0, OpKind.KERNEL),
                       ("void at::native::vectorized_elementwise_kernel<4>()", 7, 5.0, 10.0, OpKind.KERNEL),
                       ("void at::native::vectorized_elementwise_kernel<4>()", 7, 15.0, 10.0, OpKind.KERNEL),
                       ("void at::native::vectorized_elementwise_kernel<4>()", 7, 30.0, 2.0, OpKind.KERNEL)])
    ov = communication_overlap(g)
    # communication covers [10, 22): the kernels see 0, 5/10, 7/10 and 0 of it; collectives are not counted
    assert ov.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.5, 0.7, 0.0])


def test_a_contended_kernel_is_labelled_with_the_communication_that_covered_most_of_it():
    ar = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"
    sr = "ncclDevKernel_SendRecv(ncclDevComm*)"
    g = _stream_graph([(ar, 20, 0.0, 12.0, OpKind.COLLECTIVE),
                       (sr, 21, 11.0, 30.0, OpKind.COLLECTIVE),
                       ("void at::native::vectorized_elementwise_kernel<4>()", 7, 2.0, 6.0, OpKind.KERNEL),
                       ("void at::native::vectorized_elementwise_kernel<4>()", 7, 9.0, 10.0, OpKind.KERNEL),
                       ("void at::native::vectorized_elementwise_kernel<4>()", 7, 50.0, 2.0, OpKind.KERNEL)])
    g.attrs[0] = {"grid": [24, 1, 1], "block": [640, 1, 1]}
    # the first kernel ran under the all-reduce, the second mostly under the SendRecv (8 of its 10 us),
    # the third alone; the SendRecv's CTA count was not recorded
    assert communication_contention(g).tolist() == ["", "", "ncclDevKernel_AllReduce_Sum_f32_RING_LL x24",
                                                    "ncclDevKernel_SendRecv", ""]


ALL_REDUCE_LL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL x24"
SEND_RECV = "ncclDevKernel_SendRecv x8"


def test_contended_kernels_get_their_own_model_and_fall_back_to_the_isolated_one():
    s = _samples(3, 40)
    s.contention[::2] = ALL_REDUCE_LL
    s.measured_us[s.contended] *= 3.0  # communication triples what it shares the GPU with
    models = fit_class_models(s)
    assert {"elementwise", "elementwise" + ISOLATED, "elementwise" + CONTENDED} <= set(models)
    # one communication kind only: its group is the @comm group again, not fitted twice
    assert not any("[" in k for k in models)
    pred = predict_all(models, s)
    assert gmae(pred, s.measured_us) < 0.05  # one model for both would be off by ~sqrt(3)
    plain = {k: m for k, m in models.items() if "@" not in k}
    assert gmae(predict_all(plain, s), s.measured_us) > 0.3
    no_contended = {k: m for k, m in models.items() if CONTENDED not in k}
    assert np.all(np.isfinite(predict_all(no_contended, s)))  # no contended model: the plain one times them
    few = s.subset(~s.contended | (np.arange(len(s)) < 6))  # 3 contended kernels: too few for their own model
    assert not any(CONTENDED in k for k in fit_class_models(few))
    # without communication every kernel ran alone: no '@alone' models repeating the plain ones
    assert not any("@" in k for k in fit_class_models(_samples(3, 40)))
    hw = dataclasses.replace(get_hardware("a100-sxm-40gb"), kernel_models=models)
    name = s.name[0]
    # replay picks the most specific level, the kernel's state first: the family (these kernels have
    # shapes, so no variant model: see fit_class_models)
    assert not any(k.endswith("<4>") for k in models)
    assert class_model(hw, "elementwise", "fp32", name, ALL_REDUCE_LL) is models[
        model_keys("elementwise" + CONTENDED, name)[1]]
    assert class_model(hw, "elementwise", "fp32", name) is models[model_keys("elementwise" + ISOLATED, name)[1]]


def test_each_communication_kind_slows_kernels_by_its_own_factor():
    """An LL all-reduce (CTAs polling flags in memory) slows what shares the GPU far more than an
    8-channel SendRecv: one contended model for both misses each by ~sqrt of their ratio."""
    s = _samples(4, 60)
    s.contention[0::3] = ALL_REDUCE_LL
    s.contention[1::3] = SEND_RECV
    s.measured_us[s.contention == ALL_REDUCE_LL] *= 3.0
    s.measured_us[s.contention == SEND_RECV] *= 1.1
    models = fit_class_models(s)
    family = model_keys("elementwise", s.name[0])[1].split("/", 1)[1]
    assert {f"elementwise{CONTENDED}[{ALL_REDUCE_LL}]/{family}", f"elementwise{CONTENDED}[{SEND_RECV}]/{family}"} \
        <= set(models)
    assert gmae(predict_all(models, s), s.measured_us) < 0.05
    by_state = {k: m for k, m in models.items() if "[" not in k}
    assert gmae(predict_all(by_state, s.subset(s.contended)),
                s.measured_us[s.contended]) > 0.3
    hw = dataclasses.replace(get_hardware("a100-sxm-40gb"), kernel_models=models)
    name = s.name[0]
    assert class_model(hw, "elementwise", "fp32", name, ALL_REDUCE_LL) is models[
        f"elementwise{CONTENDED}[{ALL_REDUCE_LL}]/{family}"]
    # a communication kind the fit never saw: the model of all contended kernels
    assert class_model(hw, "elementwise", "fp32", name, "ncclDevKernel_AllGather x4") is models[
        f"elementwise{CONTENDED}/{family}"]


def test_kernel_variants_keep_the_numbers_that_name_the_work_per_thread():
    bw128 = "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float)"
    bw512 = "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float, float)"
    assert kernel_family(bw128) == kernel_family(bw512) and kernel_variant(bw128) != kernel_variant(bw512)
    assert model_keys("norm", bw128)[-1] == "norm/cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>"
