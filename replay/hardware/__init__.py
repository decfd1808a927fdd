"""Hardware models: presets (typed dataclasses loaded from TOML data), the compute model (kernel and
operator durations), and the network model (topology, link sharing, collective algorithms).

    hw = get_hardware("h100-sxm")                       # or a path to a user's .toml
    ComputeModel(hw).gemm(8192, 8192, 8192, dtype="bf16").tflops
    NetworkModel(hw).collective_us(CommType.ALL_REDUCE, 1 << 30, range(8))
"""
from .compute import (COMPUTE_CLASSES, MEMORY_CLASSES, ComputeModel, OpEstimate, kernel_class, launching_op,
                      peak_ratio)
from .config import (ComputeSpec, GPUSpec, HardwareConfig, NetworkSpec, NodeSpec, ProtocolSpec, get_hardware,
                     guess_hardware, list_hardware, load_hardware_file, trace_hardware)
from .network import (ALGORITHMS, CollectiveAlgorithm, CollectiveEstimate, NetworkModel, Topology, bus_factor,
                      flow_completion_times, max_min_fair_share, register_algorithm)
from .units import parse_size

__all__ = [
    "ALGORITHMS", "COMPUTE_CLASSES", "MEMORY_CLASSES", "CollectiveAlgorithm", "CollectiveEstimate",
    "ComputeModel", "ComputeSpec", "GPUSpec", "HardwareConfig", "NetworkModel", "NetworkSpec", "NodeSpec",
    "OpEstimate", "ProtocolSpec", "Topology", "bus_factor", "flow_completion_times", "get_hardware",
    "guess_hardware", "kernel_class", "launching_op", "list_hardware", "load_hardware_file",
    "max_min_fair_share", "parse_size", "peak_ratio", "register_algorithm", "trace_hardware",
]
