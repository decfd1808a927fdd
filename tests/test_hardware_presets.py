"""Hardware presets: data files with provenance, strict loading, registry, trace-device guessing."""
from __future__ import annotations

import pytest

from chakra_schema.errors import TraceInputError
from replay.hardware import config as hwconfig
from replay.hardware import get_hardware, guess_hardware, list_hardware, load_hardware_file, trace_hardware

REQUIRED = {"h100-sxm", "h200", "h800", "a100-sxm-40gb", "a100-sxm-80gb", "v100-sxm2", "b200", "gb200"}


def test_all_required_presets_load_as_typed_configs():
    assert REQUIRED <= set(list_hardware())
    for name in list_hardware():
        hw = get_hardware(name)
        assert hw.name == name
        assert isinstance(hw.gpu.sm_count, int) and hw.gpu.sm_count > 0
        assert isinstance(hw.node.nvlink_bw_gbs, float)
        assert hw.protocols and {p.name for p in hw.protocols} >= {"Simple"}


def test_every_number_in_every_preset_has_a_source():
    """Every bundled preset (not the user's installed ones, which `calibrate --install` writes)."""
    presets = sorted(hwconfig.PRESET_DIR.glob("*.toml"))
    assert REQUIRED <= {p.stem for p in presets}
    for path in presets:
        name = path.stem
        data = hwconfig._resolve(path)
        sources = data.get("sources", {})
        for sec in ("gpu", "compute", "node", "network"):
            for key in hwconfig.numeric_keys(data[sec], sec + "."):
                assert key in sources and sources[key].strip(), f"{name}: no source for {key}"
        assert sources.get("protocols"), f"{name}: no source for [[protocols]]"


def test_vendor_figures_from_the_reference():
    h100 = get_hardware("h100-sxm")
    assert h100.gpu.peak_tflops["bf16"] == pytest.approx(989.4)
    assert h100.gpu.hbm_bw_gbs == 3350 and h100.node.nvlink_bw_gbs == 450
    assert h100.node.gpus_per_node == 8 and h100.network.nics_per_node == 8 and h100.network.nic_gbps == 400
    assert h100.node.intra_topology == "nvswitch" and h100.node.nvls
    assert get_hardware("h200").gpu.hbm_bw_gbs == 4800 and get_hardware("h200").gpu.peak_tflops["bf16"] == 989.4
    assert get_hardware("h800").node.nvlink_bw_gbs == 200
    assert get_hardware("a100-sxm-40gb").gpu.hbm_bw_gbs == 1555
    assert get_hardware("a100-sxm-80gb").gpu.hbm_bw_gbs == 2039
    assert get_hardware("v100-sxm2").node.intra_topology == "hybrid_cube_mesh"
    assert not get_hardware("v100-sxm2").node.nvls and not get_hardware("a100-sxm-80gb").node.nvls
    assert get_hardware("b200").gpu.hbm_bw_gbs == 8000 and get_hardware("b200").node.nvls
    # Blackwell's tensor cores scale MX blocks natively; Hopper's take one scale per operand
    assert get_hardware("b200").gpu.block_scaled_formats == ("mxfp8", "nvfp4")
    assert get_hardware("h100-sxm").gpu.block_scaled_formats == ()
    # GB200 NVL72: the B200 silicon at 1.2 kW (2.5 PF dense BF16), 372 GB / 16 TB/s per 2-GPU superchip,
    # 72 GPUs per NVLink domain with a 400G NIC each
    gb200 = get_hardware("gb200")
    assert gb200.gpu.peak_tflops["bf16"] == 2500 and gb200.gpu.peak_tflops["fp8"] == 5000
    assert gb200.gpu.memory_gb == 372 / 2 and gb200.gpu.hbm_bw_gbs == 16000 / 2
    assert (gb200.node.gpus_per_node, gb200.network.nics_per_node, gb200.node.nvlink_bw_gbs) == (72, 72, 900)


def test_a100_sxm_is_an_alias_of_the_80gb_preset():
    assert get_hardware("a100-sxm").name == "a100-sxm-80gb"
    assert get_hardware("A100-SXM").name == "a100-sxm-80gb"


def test_user_file_with_extends_overrides_one_number(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('name = "my-h100"\nextends = "h100-sxm"\n[node]\nnvlink_bw_gbs = 300\n')
    hw = get_hardware(str(f))
    assert hw.name == "my-h100" and hw.node.nvlink_bw_gbs == 300.0
    assert hw.gpu.sm_count == 132  # inherited


@pytest.mark.parametrize("body,message", [
    ('name = "x"\nextends = "h100-sxm"\n[gpu]\nnvlink_bw_gbs = 3\n', "unknown key 'nvlink_bw_gbs' in [gpu]"),
    ('name = "x"\nextends = "h100-sxm"\n[network]\nnic_gbps = "fast"\n', "wrong type for 'nic_gbps' in [network]"),
    ('name = "x"\nextends = "h100-sxm"\n[node]\nnvls = 1\n', "wrong type for 'nvls' in [node]"),
    ('name = "x"\nextends = "h100-sxm"\nflops = 3\n', "unknown top-level key 'flops'"),
    ('name = "x"\nextends = "h100-sxm"\n[[protocols]]\nname = "LL"\nbw_frac = 0.5\n', "unknown key 'bw_frac'"),
    ('name = "x"\n[gpu]\nmodel = "g"\n', "missing required [compute]"),
    ('name = "x"\nextends = "nope"\n', "unknown preset 'nope'"),
    ('name = "x\n', "not a valid TOML file"),
    ('name = "x"\nextends = "h100-sxm"\n[gpu]\nblock_scaled_formats = ["mxfp6"]\n', "unknown 'mxfp6'"),
])
def test_bad_user_file_gives_one_line_error_naming_the_key(tmp_path, body, message):
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(TraceInputError) as e:
        load_hardware_file(f)
    assert message in str(e.value)
    assert "\n" not in str(e.value) and str(f) in str(e.value)


def test_missing_required_key_is_named(tmp_path):
    import tomllib
    data = (hwconfig.PRESET_DIR / "a100-sxm-40gb.toml").read_text().replace("sm_count = 108\n", "")
    f = tmp_path / "nosm.toml"
    f.write_text(data)
    tomllib.loads(data)  # still valid TOML
    with pytest.raises(TraceInputError, match="missing required key 'sm_count' in \\[gpu\\]"):
        load_hardware_file(f)


def test_unknown_name_is_an_input_error():
    with pytest.raises(TraceInputError, match="unknown hardware 'h1000'"):
        get_hardware("h1000")


@pytest.mark.parametrize("device,preset", [
    ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"), ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
    ("NVIDIA A100-PG509-200", "a100-sxm-40gb"), ("Tesla V100-SXM2-32GB", "v100-sxm2"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200"), ("NVIDIA H800", "h800"),
    ("NVIDIA B200", "b200"), ("NVIDIA GB200", "gb200"),
])
def test_guess_preset_from_kineto_device_name(device, preset):
    assert guess_hardware(device).name == preset
    assert trace_hardware({"deviceProperties": [{"name": device}]}).name == preset


def test_guess_unknown_device_is_none():
    assert guess_hardware("AMD Instinct MI250X") is None
    assert trace_hardware({}) is None


def test_device_names_of_shared_traces_map_to_presets(shared_traces):
    import gzip

    import orjson
    seen = {}
    for f, expect in (("hta/trace_diff_control_control.json.gz", "a100-sxm-40gb"),
                      ("hta/ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", "v100-sxm2")):
        d = orjson.loads(gzip.open(shared_traces / f).read())
        hw = trace_hardware({"deviceProperties": d.get("deviceProperties", [])})
        seen[f] = hw.name if hw else None
        assert seen[f] == expect
