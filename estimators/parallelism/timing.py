"""How the parallelism what-if times the ops it generates: the preset they run on and the timing source.
Shared by `evaluate` (the estimate) and `search` (the analytic ranking), which import it; it imports
neither."""
from __future__ import annotations


def default_timing(hardware):
    from replay.model_timing import ModelTiming  # the project's TimingSource over the hardware models
    return ModelTiming(hardware)


def resolve_hardware(hardware):
    """The preset for the generated workload: kernel models fitted on recorded kernels stay out
    (`replay.hardware.config.for_generated_ops`)."""
    from replay.hardware.config import for_generated_ops
    return for_generated_ops(hardware)
