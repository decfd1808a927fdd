"""Two-micro-batch overlap as published (estimators.moe.overlap): DeepSeek's decode and prefill designs, as
SGLang's operations strategies run them, hide an all-to-all only behind the other micro-batch's stages that
run before it is received. Timelines below are worked by hand from those stage lists."""
from __future__ import annotations

import pytest

from estimators.moe.overlap import SCHEDULES, LayerWork, schedule_for

# one MoE layer of one micro-batch (us): attention prepare 10, core 20, shared 5, experts 15, dispatch 30,
# combine 25 (compute 50, communication 55)
ONE = LayerWork(attn_prepare=10, attn_core=20, moe=True, shared=5, experts=15, dispatch=30, combine=25)


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


def test_prefill_two_layers_the_last_stage_runs_into_the_next_layers_attention():
    """[attn, send d] [recv d, experts, send c] [shared, recv c, next attn, send d'] ...: A.attn 0-30, d_A
    30-60; B.attn 30-60, d_B 60-90; A experts 60-75, c_A 90-115; B experts 90-105, c_B 115-140; A shared
    105-110, waits for c_A until 115, attn 115-145, d_A' 145-175; B shared 145-150 (c_B in at 140), attn
    150-180, d_B' 180-210; A (d_A' in at 175) experts 180-195, c_A' 210-235 behind d_B'; B waits until 210,
    experts 210-225, c_B' 235-260; A shared 225-230, waits until 235; B shared 235-240, waits until 260."""
    assert SCHEDULES["dual-batch-prefill"].forward_us([ONE, ONE]) == pytest.approx(260.0)


def test_decode_a_dense_layer_runs_into_the_first_moe_layers_first_stage():
    """Dense (attention 30 + FFN 30) then ONE: A [dense, prep] 0-70, [core] 70-90, [send d 90-120, shared]
    90-95; B [dense, prep] 95-165; A waits for d (in at 120), experts 165-180, sends c 180-205; B core
    180-200; A waits until 205; B sends d 205-235, shared 205-210; B waits until 235, experts 235-250, sends
    c 250-275, waits until 275."""
    dense = LayerWork(attn_prepare=10, attn_core=20, ffn=30)
    assert SCHEDULES["dual-batch-decode"].forward_us([dense, ONE]) == pytest.approx(275.0)


def test_a_moe_layer_with_shared_experts_only_keeps_them():
    shared_only = LayerWork(attn_prepare=10, attn_core=20, moe=True, shared=5)
    dense_with_shared = LayerWork(attn_prepare=10, attn_core=20, shared=5)
    for layer in (shared_only, dense_with_shared):
        assert SCHEDULES["none"].forward_us([layer]) == pytest.approx(35.0)
        for name in ("dual-batch-decode", "dual-batch-prefill", "dual-batch-ideal"):
            assert SCHEDULES[name].forward_us([layer]) == pytest.approx(70.0)


def test_an_attention_all_reduce_holds_the_stream_in_every_schedule():
    """A TP all-reduce of 50 per micro-batch, little compute: no schedule hides it, the bound included."""
    w = LayerWork(attn_prepare=1, attn_core=1, tp_allreduce=50, moe=True, experts=1, dispatch=25, combine=25)
    bound = SCHEDULES["dual-batch-ideal"].forward_us([w] * 4)
    assert bound == pytest.approx(4 * 2 * 53.0)
    for name in ("dual-batch-decode", "dual-batch-prefill"):
        assert SCHEDULES[name].forward_us([w] * 4) >= bound


def test_the_communications_share_of_the_sms_must_leave_some():
    with pytest.raises(ValueError, match="share"):
        SCHEDULES["dual-batch-prefill"].forward_us([ONE], comm_sm_share=1.0)
    from estimators.moe.serving import PREFILL_COMM_SMS, prefill_comm_sm_share
    assert prefill_comm_sm_share(132) == pytest.approx(PREFILL_COMM_SMS / 132)
    assert prefill_comm_sm_share(24) == 0.5 and prefill_comm_sm_share(16) == 0.5     # at most half


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
    with pytest.raises(ValueError, match="overlap must be one of"):
        schedule_for("dual-batch-decode", "prefill")
    with pytest.raises(ValueError, match="serving schedule"):
        schedule_for("dual-batch", "train")


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
