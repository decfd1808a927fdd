"""Two-micro-batch overlap as published (estimators.moe.overlap): DeepSeek's decode and prefill designs, as
SGLang's operations strategies run them, hide an all-to-all only behind the other micro-batch's stages that
run before it is received. Timelines below are worked by hand from those stage lists."""
from __future__ import annotations

import pytest

from estimators.moe.overlap import SCHEDULES, LayerWork, schedule_for

# one MoE layer of one micro-batch (us): attention prepare 10, core 20, shared 5, experts 15, dispatch 30,
# combine 25 (compute 50, communication 55)
ONE = LayerWork(attn_prepare=10, attn_core=20, shared=5, experts=15, dispatch=30, combine=25)


def test_decode_hides_dispatch_behind_shared_and_the_others_prepare_and_combine_behind_its_core():
    """Stages [prep] [core] [send d, shared] [recv d, experts, send c] [recv c], B two stages behind A:
    A.prep 0-10, A.core 10-30, A sends d (30-60) and runs shared 30-35, B.prep 35-45, A waits for d until 60,
    experts 60-75, sends c (75-100); B.core 75-95; A waits for c until 100; B sends d (100-130), shared
    100-105; B waits until 130, experts 130-145, sends c (145-170), waits until 170."""
    assert SCHEDULES["dual-batch-decode"].forward_us([ONE]) == pytest.approx(170.0)


def test_prefill_hides_dispatch_behind_the_others_attention_and_combine_behind_its_experts():
    """Stages [attention, send d] [recv d, experts, send c] [shared, recv c], no lag; one channel, transfers
    in the order sent: A.attn 0-30, d_A 30-60; B.attn 30-60, d_B 60-90; A experts 60-75, c_A 90-115;
    B experts 90-105, c_B 115-140; A shared 105-110, waits for c_A until 115; B shared 115-120, waits until
    140."""
    assert SCHEDULES["dual-batch-prefill"].forward_us([ONE]) == pytest.approx(140.0)


def test_prefill_compute_runs_on_the_sms_the_all_to_all_leaves():
    """Half the SMs held by the communication kernels: every compute part takes twice as long. A.attn 0-60,
    d_A 60-90; B.attn 60-120, d_B 120-150; A experts 120-150, c_A 150-175; B experts 150-180, c_B 180-205;
    A shared 180-190, c_A is in; B shared 190-200, waits until 205."""
    assert SCHEDULES["dual-batch-prefill"].forward_us([ONE], comm_sm_share=0.5) == pytest.approx(205.0)


def test_no_overlap_adds_everything_and_ideal_overlap_hides_all_it_can():
    assert SCHEDULES["none"].forward_us([ONE]) == pytest.approx(105.0)
    # max(both communications 2 x 55, both computes 2 x 50): the bound, no fill
    assert SCHEDULES["dual-batch-ideal"].forward_us([ONE]) == pytest.approx(110.0)
    assert SCHEDULES["dual-batch-ideal"].forward_us([ONE], comm_sm_share=0.5) == pytest.approx(200.0)
    # the published schedules sit between the bound and two micro-batches one after the other
    for name in ("dual-batch-decode", "dual-batch-prefill"):
        assert 110.0 < SCHEDULES[name].forward_us([ONE]) < 2 * 105.0


def test_dense_layers_have_nothing_to_hide():
    dense = [LayerWork(attn_prepare=10, attn_core=20, ffn=30)] * 3
    for name in ("dual-batch-decode", "dual-batch-prefill"):
        assert SCHEDULES[name].forward_us(dense) == pytest.approx(2 * 3 * 60.0)
    assert SCHEDULES["none"].forward_us(dense) == pytest.approx(3 * 60.0)


def test_dual_batch_means_the_published_schedule_of_the_phase():
    assert schedule_for("dual-batch", "decode").name == "dual-batch-decode"
    assert schedule_for("dual-batch", "prefill").name == "dual-batch-prefill"
    assert schedule_for("dual-batch-ideal", "decode").name == "dual-batch-ideal"
    assert schedule_for("none", "prefill").micro_batches == 1


def test_sglang_decode_two_batch_overlap_speedup_is_near_the_published_one(capsys):
    """SGLang's DeepSeek-V3 decode on 9 x 8 H100 (EP72, 256 sequences per GPU, 2K KV): two-batch overlap is
    a 25.5% speedup (LMSYS blog 2025-05-05). Ideal overlap would claim far more."""
    import json
    from pathlib import Path
    from lumos_sim.cli import main
    dep = Path(__file__).resolve().parents[1] / "examples" / "deployments" / "deepseek-v3-decode-ep72-h100-sglang.toml"
    got = {}
    for overlap in ("none", "dual-batch", "dual-batch-ideal"):
        assert main(["whatif", "moe", "--deployment", str(dep), "--overlap", overlap, "--json"]) == 0
        got[overlap] = json.loads(capsys.readouterr().out)["tokens_per_s_per_node"]
    assert got["dual-batch"] / got["none"] == pytest.approx(1.255, rel=0.08)
    assert got["dual-batch-ideal"] / got["none"] > 1.5
