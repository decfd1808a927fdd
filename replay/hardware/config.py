"""Hardware presets as typed dataclasses, loaded from TOML data files.

A preset is a TOML file with the tables [gpu], [compute], [node], [network] and a list of
[[protocols]] (NCCL's LL / LL128 / Simple). Built-in presets live in `replay/hardware/presets/`; every
number in them has a provenance line in their [sources] table (dotted key -> where it came from), which
a test enforces. A preset may start from another with `extends = "name"` and override single keys.

The loader is strict: an unknown key, a value of the wrong type or a missing required key raises
`TraceInputError(path, "unknown key 'nvlink_bw_gbs' in [gpu]")`, one line naming the key, so a typo in a
user's own `--hardware my.toml` never silently falls back to a default.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chakra_schema.errors import TraceInputError, check_choice, check_number, read_toml, reject_unknown_keys, with_path

PRESET_DIR = Path(__file__).resolve().parent / "presets"
# GPUs of one scale-up (NVLink) domain: the largest announced is 576 (NVL576); larger is a typo, and the
# network model divides rank ids by it in C longs (`lumos-sim whatif moe --gpus-per-node` has the same cap)
MAX_GPUS_PER_NODE = 4096
# SMs of one GPU: the largest shipped has 160 (B200, two dies); the GEMM model's wave count divides by
# sm_count, and a 400-digit count rounded that to a zero float
MAX_SMS = 1 << 16
# Any count or length a preset gives (K units, tile sizes, nodes under a leaf): past 2^31 is a typo, and the
# models convert these to floats (a 400-digit integer overflows there)
MAX_COUNT = 1 << 31
# NCCL's protocols, the names the collective algorithms of replay/hardware/network.py look up; every
# algorithm can run Simple, so a preset without it left some collectives with no protocol (a ValueError)
NCCL_PROTOCOLS = ("LL", "LL128", "Simple")


# --------------------------------------------------------------------------------------------- specs
BLOCK_SCALED_FORMATS = ("mxfp8", "nvfp4")


@dataclass(frozen=True)
class GPUSpec:
    """One GPU: peaks and the memory system (vendor figures)."""

    model: str                              # marketing name, e.g. "H100 SXM5 80GB"
    sm_count: int
    memory_gb: float
    hbm_bw_gbs: float                       # peak HBM bandwidth, GB/s
    peak_tflops: dict[str, float]           # dense peak by dtype: bf16, fp16, fp8, tf32, fp32, fp64
    pcie_bw_gbs: float                      # host link, GB/s per direction (peak)
    kernel_start_after_call_us: float       # an idle GPU starts a kernel this long after the launch call starts
    device_names: tuple[str, ...] = ()      # substrings of Kineto `deviceProperties[].name` that mean this GPU
    # block-scaled low-precision formats its tensor cores scale natively (Blackwell: "mxfp8", "nvfp4");
    # Hopper's take one scale per operand, so an MX recipe cannot run there
    block_scaled_formats: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_number("[gpu] sm_count", self.sm_count, 1, MAX_SMS, integer=True)
        for name in ("memory_gb", "hbm_bw_gbs", "pcie_bw_gbs"):
            check_number(f"[gpu] {name}", getattr(self, name), 0, low_open=True)
        check_number("[gpu] kernel_start_after_call_us", self.kernel_start_after_call_us, 0)
        if not self.peak_tflops:
            raise TraceInputError(None, "[gpu] peak_tflops is empty")
        reject_unknown_keys(None, self.peak_tflops, _DTYPE_FALLBACK, where=" in [gpu.peak_tflops]")
        for dtype, v in self.peak_tflops.items():
            check_number(f"[gpu] peak_tflops.{dtype}", v, 0)   # 0: the GPU lacks the type (no fp8 on A100)
        if not any(v > 0 for v in self.peak_tflops.values()):
            raise TraceInputError(None, "[gpu] peak_tflops needs at least one dtype with a peak > 0")
        unknown = [f for f in self.block_scaled_formats if f not in BLOCK_SCALED_FORMATS]
        if unknown:
            raise TraceInputError(None, f"[gpu] block_scaled_formats: unknown {', '.join(map(repr, unknown))} "
                                        f"(known: {', '.join(BLOCK_SCALED_FORMATS)})")


@dataclass(frozen=True)
class ComputeSpec:
    """Achievable fractions of the peaks and the GEMM tile model (see replay/hardware/compute.py)."""

    gemm_efficiency: float                  # mainloop fraction of tensor peak reached by the best tile shape
    gemm_tiles: tuple[tuple[int, int], ...]  # CTA tile shapes (tile_m, tile_n) the GEMM library picks among
    gemm_tile_intensity_knee: float         # operand reuse tm*tn/(tm+tn) at which a tile saturates the SM
    gemm_k_overhead: int                    # pipeline fill + epilogue per tile, in units of K
    gemm_split_k: tuple[int, ...]           # split-K factors the library may use for small M*N
    hbm_efficiency: float                   # achievable fraction of HBM bandwidth (streaming kernels)
    pcie_efficiency: float                  # achievable fraction of PCIe bandwidth (pinned memcpy)
    attention_fwd_efficiency: float         # flash-attention forward fraction of tensor peak
    attention_bwd_efficiency: float         # flash-attention backward fraction of tensor peak
    attention_block: int                    # query rows per attention CTA (flash tile)
    min_kernel_us: float                    # shortest kernel duration (launch-to-retire of an empty grid)
    pageable_copy_efficiency: float = 0.35  # pageable host memory: fraction of PCIe (staged via a bounce buffer)
    sustained_tensor_fraction: float = 1.0  # tensor throughput the board sustains at its power limit (long runs),
                                            # as a fraction of the dense peak: caps GEMM / attention rates
    gemm_efficiency_by_dtype: dict[str, float] = field(default_factory=dict)  # per-dtype mainloop fraction
                                            # (bf16, fp8, tf32, ...); a dtype not listed uses gemm_efficiency

    def gemm_efficiency_for(self, dtype: str) -> float:
        return self.gemm_efficiency_by_dtype.get(dtype, self.gemm_efficiency)

    def __post_init__(self) -> None:
        for name in ("gemm_efficiency", "hbm_efficiency", "pcie_efficiency", "attention_fwd_efficiency",
                     "attention_bwd_efficiency", "pageable_copy_efficiency", "sustained_tensor_fraction"):
            check_number(f"[compute] {name}", getattr(self, name), 0, 1, low_open=True)
        if not self.gemm_tiles or any(len(t) != 2 or min(t) <= 0 or max(t) > MAX_COUNT for t in self.gemm_tiles):
            raise TraceInputError(None, f"[compute] gemm_tiles must be a list of [tile_m, tile_n] pairs > 0 "
                                        f"(at most {MAX_COUNT:,})")
        check_number("[compute] gemm_tile_intensity_knee", self.gemm_tile_intensity_knee, 0, low_open=True)
        check_number("[compute] gemm_k_overhead", self.gemm_k_overhead, 0, MAX_COUNT, integer=True)
        if not self.gemm_split_k or any(not isinstance(k, int) or k < 1 for k in self.gemm_split_k):
            raise TraceInputError(None, "[compute] gemm_split_k must be a non-empty list of integers >= 1")
        if 1 not in self.gemm_split_k:   # the GEMM model falls back to no split where a split cannot help
            raise TraceInputError(None, f"[compute] gemm_split_k must include 1 (no split), got {list(self.gemm_split_k)}")
        check_number("[compute] attention_block", self.attention_block, 1, MAX_COUNT, integer=True)
        check_number("[compute] min_kernel_us", self.min_kernel_us, 0)
        for d, v in self.gemm_efficiency_by_dtype.items():
            check_number(f"[compute] gemm_efficiency_by_dtype.{d}", v, 0, 1, low_open=True)


@dataclass(frozen=True)
class NodeSpec:
    """Scale-up domain: GPUs of one node and their NVLink fabric."""

    gpus_per_node: int
    intra_topology: str                     # "nvswitch" (crossbar) | "hybrid_cube_mesh" (DGX-1)
    nvlink_bw_gbs: float                    # per GPU per direction, GB/s (half the bidirectional figure)
    nvlink_efficiency: float                # achievable fraction by NCCL copy kernels
    nvls: bool                              # NVLink SHARP (in-switch reduction) available
    nvls_efficiency: float                  # achievable fraction of NVLink bandwidth by NVLS multimem ops
    nvlink_link_bw_gbs: float = 0.0         # one NVLink link per direction (mesh topologies)
    nvlink_mesh: tuple[tuple[int, ...], ...] = ()  # (gpu_a, gpu_b, number of links) for mesh topologies

    def __post_init__(self) -> None:
        check_number("[node] gpus_per_node", self.gpus_per_node, 1, MAX_GPUS_PER_NODE, integer=True)
        if self.intra_topology not in ("nvswitch", "hybrid_cube_mesh"):
            raise TraceInputError(None, f"unknown [node] intra_topology '{self.intra_topology}' "
                                        "(expected nvswitch or hybrid_cube_mesh)")
        check_number("[node] nvlink_bw_gbs", self.nvlink_bw_gbs, 0, low_open=True)
        check_number("[node] nvlink_efficiency", self.nvlink_efficiency, 0, 1, low_open=True)
        # 0 is allowed where there is no NVLS; a node that has it needs a fraction > 0
        check_number("[node] nvls_efficiency", self.nvls_efficiency, 0, 1, low_open=self.nvls)
        check_number("[node] nvlink_link_bw_gbs", self.nvlink_link_bw_gbs, 0)
        if self.intra_topology == "hybrid_cube_mesh":
            if not self.nvlink_mesh or self.nvlink_link_bw_gbs <= 0:
                raise TraceInputError(None, "[node] hybrid_cube_mesh needs nvlink_mesh and nvlink_link_bw_gbs")
            for e in self.nvlink_mesh:
                if len(e) != 3 or not all(0 <= g < self.gpus_per_node for g in e[:2]) or e[2] < 1:
                    raise TraceInputError(None, f"[node] nvlink_mesh entry {list(e)} is not [gpu_a, gpu_b, links]")


@dataclass(frozen=True)
class NetworkSpec:
    """Scale-out: NICs and the fabric between nodes."""

    topology: str                           # "rail_fat_tree"
    nics_per_node: int
    nic_gbps: float                         # line rate per NIC, Gb/s
    nic_efficiency: float                   # achieved fraction of line rate
    oversubscription: float                 # leaf downlink : uplink capacity (1.0 = non-blocking)
    nodes_per_leaf: int                     # nodes under one leaf switch per rail
    switch_latency_us: float                # extra latency of a spine hop
    pxn: bool = True                        # NCCL PXN: cross-rail traffic hops over NVLink to the right rail
    tree_efficiency: float = 1.0            # achievable fraction of a tree's link-bound bandwidth
    alltoall_efficiency: float = 1.0        # achieved fraction of the link-bound rate of a grouped all-to-all

    def __post_init__(self) -> None:
        if self.topology != "rail_fat_tree":
            raise TraceInputError(None, f"unknown [network] topology '{self.topology}' (expected rail_fat_tree)")
        check_number("[network] nics_per_node", self.nics_per_node, 1, integer=True)
        check_number("[network] nodes_per_leaf", self.nodes_per_leaf, 1, MAX_COUNT, integer=True)
        check_number("[network] nic_gbps", self.nic_gbps, 0, low_open=True)
        check_number("[network] oversubscription", self.oversubscription, 0, low_open=True)
        check_number("[network] switch_latency_us", self.switch_latency_us, 0)
        for name in ("nic_efficiency", "tree_efficiency", "alltoall_efficiency"):
            check_number(f"[network] {name}", getattr(self, name), 0, 1, low_open=True)


@dataclass(frozen=True)
class ProtocolSpec:
    """An NCCL protocol: bandwidth fraction it can use and its latencies (per collective and per hop)."""

    name: str
    bw_fraction: float
    base_latency_us: float
    nvlink_hop_us: float
    net_hop_us: float

    def __post_init__(self) -> None:
        if not self.name:
            raise TraceInputError(None, "[[protocols]] name is empty")
        check_choice("[[protocols]] name", self.name, NCCL_PROTOCOLS)
        check_number(f"[[protocols]] {self.name}: bw_fraction", self.bw_fraction, 0, 1, low_open=True)
        for name in ("base_latency_us", "nvlink_hop_us", "net_hop_us"):
            check_number(f"[[protocols]] {self.name}: {name}", getattr(self, name), 0)


@dataclass(frozen=True)
class KernelClassModel:
    """A kernel class's fitted timing model (see replay/hardware/kernel_models.py): time = overhead_us +
    roofline time / efficiency when the launching op's shapes are known, else the launch-geometry
    regression: a + b * CTAs * threads-per-CTA (2 numbers), exp(g0 + gx ln grid.x + gy ln grid.y +
    gz ln grid.z + gt ln threads-per-CTA + gs ln(1 + shared memory bytes per CTA)) (6 numbers), or, in
    presets written before the grid's axes were kept apart, exp(g0 + g1 ln CTAs + g2 ln threads-per-CTA)
    (3 numbers). Written by `lumos-sim calibrate`."""

    overhead_us: float = 0.0                # fixed per-kernel cost (launch-to-retire, tail of the last wave)
    efficiency: float = 1.0                 # achieved / preset roofline rate (above 1: the preset is pessimistic)
    geometry: tuple[float, ...] = ()        # launch-geometry regression: 2, 6 (or 3) numbers; () = none
    kernels: int = 0                        # kernels the fit used
    fit_gmae: float = 0.0                   # in-sample geometric-mean absolute error of the fit
    shaped_by_geometry: bool = False        # the geometry model times kernels with shapes too (it fit them better)
    times_shaped: bool = True               # fitted on kernels with shapes: times them (else they keep the physics)

    def __post_init__(self) -> None:
        if not self.overhead_us >= 0 or not self.efficiency > 0 or len(self.geometry) not in (0, 2, 3, 6):
            raise TraceInputError(None, "[kernel_models] needs overhead_us >= 0, efficiency > 0 and "
                                        "geometry of 2, 3 or 6 numbers or none")


@dataclass(frozen=True)
class CalibrationInfo:
    """Provenance of a calibrated preset."""

    base: str = ""                          # the preset it extends
    traces: tuple[str, ...] = ()            # trace file names fitted on
    kernels: int = 0                        # GPU kernels used by the fits
    tool: str = ""                          # what wrote it (lumos-sim version, date)
    software: str = ""                      # what the traces ran (torch, CUDA, driver versions)
    collected: str = ""                     # when / where the traces were collected


@dataclass(frozen=True)
class HardwareConfig:
    name: str
    description: str
    gpu: GPUSpec
    compute: ComputeSpec
    node: NodeSpec
    network: NetworkSpec
    protocols: tuple[ProtocolSpec, ...]
    aliases: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)
    path: str = ""
    kernel_models: dict[str, KernelClassModel] = field(default_factory=dict)  # class -> fitted model
    calibration: CalibrationInfo | None = None

    def __post_init__(self) -> None:
        if not self.protocols:
            raise TraceInputError(self.path or None, "[[protocols]] must be a non-empty array of tables")
        if "Simple" not in {p.name for p in self.protocols}:
            raise TraceInputError(self.path or None, "[[protocols]] needs a 'Simple' entry: every collective "
                                                     "algorithm can run it, and some only it")

    # -------- derived figures used by the models (GB/s are 1e9 bytes/s)
    @property
    def hbm_bytes_per_us(self) -> float:
        return self.gpu.hbm_bw_gbs * self.compute.hbm_efficiency * 1e3

    @property
    def nic_gbs(self) -> float:
        """Achieved bytes/s of one NIC, in GB/s."""
        return self.network.nic_gbps / 8.0 * self.network.nic_efficiency

    def peak_flops(self, dtype: str) -> float:
        """Dense tensor peak in FLOP/s for `dtype`, falling back to the nearest supported type
        (no fp8 before Hopper -> fp16 rate; no bf16 on Volta -> fp32 rate)."""
        p = self.gpu.peak_tflops
        for d in _DTYPE_FALLBACK.get(dtype, (dtype, "fp32")):
            if p.get(d, 0.0) > 0:
                return p[d] * 1e12
        return max(p.values()) * 1e12


_DTYPE_FALLBACK = {
    "fp8": ("fp8", "fp16", "bf16"),
    "bf16": ("bf16", "fp32"),
    "fp16": ("fp16", "bf16", "fp32"),
    "tf32": ("tf32", "fp32"),
    "fp32": ("fp32",),
    "fp64": ("fp64", "fp32"),
}

# top-level TOML table -> spec class
_SECTIONS: dict[str, type] = {"gpu": GPUSpec, "compute": ComputeSpec, "node": NodeSpec, "network": NetworkSpec}
_TOP_KEYS = {"name", "description", "extends", "aliases", "sources", "protocols", "kernel_models", "calibration",
             *_SECTIONS}


# ------------------------------------------------------------------------------------------- loading
def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, where: str, path: str) -> Any:
    """Check `value` against the annotation `tp` and convert lists to tuples; raise one-line errors."""
    origin = typing.get_origin(tp)
    bad = TraceInputError(path, f"wrong type for {where}: expected {_type_name(tp)}, got "
                                f"{type(value).__name__} {value!r}"[:200])
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        try:
            return float(value)
        except OverflowError:   # a TOML integer past the float range
            raise TraceInputError(path, f"{where} must be a finite number, got {value}"[:200]) from None
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise bad
        (elem, _) = typing.get_args(tp)
        return tuple(_convert(v, elem, f"{where}[{i}]", path) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        _, vt = typing.get_args(tp)
        return {str(k): _convert(v, vt, f"{where}.{k}", path) for k, v in value.items()}
    raise bad  # pragma: no cover - every annotation used above is handled


def _build_kernel_model(cls_name: str, table: Any, path: str) -> "KernelClassModel":
    try:
        return _build(KernelClassModel, table, f"kernel_models.{cls_name}", path)
    except TraceInputError as e:   # the model's own checks do not know which class they belong to
        raise TraceInputError(path, e.problem.replace("[kernel_models]", f"[kernel_models.{cls_name}]")) from None


@functools.lru_cache(maxsize=None)
def _schema(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """A config class's resolved field types and fields. Resolving the hints evaluates every annotation,
    the largest cost of loading a preset with many kernel models, so each class resolves once."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}


def _build(cls: type, table: Any, section: str, path: str) -> Any:
    if not isinstance(table, dict):
        raise TraceInputError(path, f"[{section}] must be a table")
    hints, fields = _schema(cls)
    reject_unknown_keys(path, table, fields, where=f" in [{section}]")
    kwargs = {}
    for name, f in fields.items():
        if name not in table:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TraceInputError(path, f"missing required key '{name}' in [{section}]")
            continue
        kwargs[name] = _convert(table[name], hints[name], f"'{name}' in [{section}]", path)
    try:
        return cls(**kwargs)
    except TraceInputError as e:   # the dataclass's own range checks: name the file
        raise with_path(e, path) from None


def _read_toml(path: Path) -> dict:
    return read_toml(path, "hardware .toml file")


def _resolve(path: Path, seen: tuple[str, ...] = ()) -> dict:
    data = _read_toml(path)
    parent = data.get("extends")
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise TraceInputError(path, f"wrong type for 'extends': expected str, got {type(parent).__name__}")
    if parent in seen:
        raise TraceInputError(path, f"'extends' cycle through '{parent}'")
    base_path = _preset_path(parent)
    if base_path is None:
        raise TraceInputError(path, f"'extends' names unknown preset '{parent}'")
    base = _resolve(base_path, seen + (parent,))
    base = {k: v for k, v in base.items() if k not in ("aliases", "name", "description")}
    merged = _merge(base, {k: v for k, v in data.items() if k != "extends"})
    return merged


def load_hardware_file(path: str | os.PathLike) -> HardwareConfig:
    """Load one preset file (built-in or a user's own) into a `HardwareConfig`."""
    path = Path(path)
    data = _resolve(path)
    spath = str(path)
    reject_unknown_keys(spath, data, _TOP_KEYS, what="top-level key")
    # typos first: an unknown key explains a "missing" one better than the other way round
    for sec, cls in _SECTIONS.items():
        table = data.get(sec)
        if isinstance(table, dict):
            reject_unknown_keys(spath, table, (f.name for f in dataclasses.fields(cls)), where=f" in [{sec}]")
    for i, p in enumerate(data.get("protocols") or []):
        if isinstance(p, dict):
            reject_unknown_keys(spath, p, (f.name for f in dataclasses.fields(ProtocolSpec)),
                                where=f" in [[protocols]] #{i + 1}")
    for key in ("name", *_SECTIONS, "protocols"):
        if key not in data:
            what = f"[{key}]" if key in _SECTIONS else ("[[protocols]]" if key == "protocols" else f"'{key}'")
            raise TraceInputError(spath, f"missing required {what}")
    specs = {sec: _build(cls, data[sec], sec, spath) for sec, cls in _SECTIONS.items()}
    protos = data["protocols"]
    if not isinstance(protos, list) or not protos:
        raise TraceInputError(spath, "[[protocols]] must be a non-empty array of tables")
    protocols = tuple(_build(ProtocolSpec, p, f"protocols.{i}", spath) for i, p in enumerate(protos))
    name = _convert(data["name"], str, "'name'", spath)
    kernel_models = data.get("kernel_models", {})
    if not isinstance(kernel_models, dict):
        raise TraceInputError(spath, "[kernel_models] must be a table of kernel classes")
    models = {str(k): _build_kernel_model(k, v, spath) for k, v in kernel_models.items()}
    calibration = (_build(CalibrationInfo, data["calibration"], "calibration", spath)
                   if "calibration" in data else None)
    hw = HardwareConfig(
        name=name,
        description=_convert(data.get("description", ""), str, "'description'", spath),
        protocols=protocols,
        aliases=_convert(data.get("aliases", []), tuple[str, ...], "'aliases'", spath),
        sources=_convert(data.get("sources", {}), dict[str, str], "'sources'", spath),
        path=spath,
        kernel_models=models,
        calibration=calibration,
        **specs,
    )
    return hw


# ------------------------------------------------------------------------------------------ registry
def user_preset_dir() -> Path:
    """Where `lumos-sim calibrate --install NAME` puts presets and where `--hardware NAME` also looks:
    $LUMOS_SIM_HOME/hardware when LUMOS_SIM_HOME is set, else $XDG_CONFIG_HOME/lumos-sim/hardware
    (~/.config/lumos-sim/hardware)."""
    home = os.environ.get("LUMOS_SIM_HOME")
    if home:
        return Path(home).expanduser() / "hardware"
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "lumos-sim" / "hardware"


def _preset_files() -> dict[str, Path]:
    """Built-in presets, then the user's installed ones (a built-in name is never shadowed)."""
    out = {p.stem: p for p in sorted(PRESET_DIR.glob("*.toml"))}
    user = user_preset_dir()
    if user.is_dir():
        for p in sorted(user.glob("*.toml")):
            out.setdefault(p.stem, p)
    return out


def is_builtin_preset(name: str) -> bool:
    return (PRESET_DIR / f"{name}.toml").is_file()


_ALIAS_CACHE: dict[str, str] | None = None


def _aliases() -> dict[str, str]:
    global _ALIAS_CACHE
    if _ALIAS_CACHE is None:
        out: dict[str, str] = {}
        for stem, p in _preset_files().items():
            for a in _read_toml(p).get("aliases", []) or []:
                out[str(a)] = stem
        _ALIAS_CACHE = out
    return _ALIAS_CACHE


def _preset_path(name: str) -> Path | None:
    files = _preset_files()
    key = name.lower()
    if key in files:
        return files[key]
    target = _aliases().get(key)
    return files.get(target) if target else None


_CACHE: dict[str, HardwareConfig] = {}


def list_hardware() -> list[str]:
    """Names of the built-in presets (aliases not included)."""
    return sorted(_preset_files())


def for_generated_ops(name_or_path: str | os.PathLike | HardwareConfig) -> HardwareConfig:
    """The preset as the what-ifs time the ops they generate from a model and a plan: without the kernel
    models and sustained tensor rate a calibration fitted. Those were fitted on recorded kernels (their names,
    launch geometry, and the small shapes of the traces they came from) and time recorded kernels; a
    generated op has none of that, so it is timed on the roofline, with the what-if's own documented
    constants (estimators.parallelism). Every other field -- overrides included -- is kept."""
    hw = get_hardware(name_or_path)
    if hw.calibration is None and not hw.kernel_models:
        return hw
    base = get_hardware(hw.calibration.base) if hw.calibration is not None else hw
    compute = dataclasses.replace(hw.compute, sustained_tensor_fraction=base.compute.sustained_tensor_fraction)
    return dataclasses.replace(hw, kernel_models={}, calibration=None, compute=compute)


def get_hardware(name_or_path: str | os.PathLike | HardwareConfig) -> HardwareConfig:
    """A preset by name or alias ('h100-sxm', 'a100-sxm'), or a user's TOML file by path."""
    if isinstance(name_or_path, HardwareConfig):
        return name_or_path
    key = str(name_or_path)
    if key in _CACHE:
        return _CACHE[key]
    p = _preset_path(key)
    if p is None:
        looks_like_file = key.endswith(".toml") or os.sep in key or Path(key).exists()
        if not looks_like_file:
            raise TraceInputError(None, f"unknown hardware '{key}' (presets: {', '.join(list_hardware())}; "
                                        "or give a path to a .toml file)")
        p = Path(key)
    hw = load_hardware_file(p)
    _CACHE[key] = hw
    return hw


def guess_hardware(device_name: str | None) -> HardwareConfig | None:
    """The preset for a Kineto device name ('NVIDIA A100-SXM4-40GB', 'Tesla V100-SXM2-32GB'), or None.
    The longest matching `device_names` entry wins (so '80GB' variants beat the generic name)."""
    if not device_name:
        return None
    text = device_name.upper()
    best: tuple[int, str] | None = None
    for stem in list_hardware():
        hw = get_hardware(stem)
        for pat in hw.gpu.device_names:
            if pat.upper() in text and (best is None or len(pat) > best[0]):
                best = (len(pat), stem)
    return get_hardware(best[1]) if best else None


def recorded_device_names(metadata: dict[str, Any] | None) -> list[str]:
    """The hardware a trace's graph metadata names, most explicit first: a 'hardware' / 'device_name' /
    'gpu_name' entry, then each Kineto `deviceProperties` name."""
    if not metadata:
        return []
    names = [metadata[k] for k in ("hardware", "device_name", "gpu_name") if isinstance(metadata.get(k), str)]
    props = metadata.get("deviceProperties") or metadata.get("device_properties")
    if isinstance(props, list):
        names += [d["name"] for d in props if isinstance(d, dict) and isinstance(d.get("name"), str) and d["name"]]
    return names


def trace_hardware(metadata: dict[str, Any] | None) -> HardwareConfig | None:
    """Guess a trace's hardware from its graph metadata (`recorded_device_names`): a preset name, or a
    device name a preset matches."""
    for name in recorded_device_names(metadata):
        if _preset_path(name) is not None:
            return get_hardware(name)
        hw = guess_hardware(name)
        if hw:
            return hw
    return None


def numeric_keys(hw_data: dict, prefix: str = "") -> list[str]:
    """Dotted keys of every number in a raw preset table (used to check that each has a source)."""
    out = []
    for k, v in hw_data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            if v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v.values()):
                out.append(key)  # a table of numbers (e.g. peak_tflops by dtype) has one source
            else:
                out += numeric_keys(v, key + ".")
        elif isinstance(v, bool):
            continue
        elif isinstance(v, (int, float)):
            out.append(key)
        elif isinstance(v, list) and v and all(isinstance(x, (int, float, list)) for x in v):
            out.append(key)
    return out
