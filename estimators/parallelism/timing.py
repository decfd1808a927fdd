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


def check_precision_support(hw, precision: str, fp8_recipe: str, work: str = "training") -> None:
    """A plan's GEMM precision must be one the hardware runs: FP8 needs FP8 tensor cores (a preset with an
    fp8 peak: Hopper and later; the A100 and V100 have none), and an MX block-scaled recipe needs tensor cores
    that scale blocks natively (`[gpu] block_scaled_formats`; Blackwell). Transformer Engine refuses both
    elsewhere, so a prediction of one would be of a run that cannot happen. `work`: what runs ("training",
    "serving"), for the message."""
    if hw is None or precision != "fp8":
        return
    from chakra_schema.errors import TraceInputError
    if hw.gpu.peak_tflops.get("fp8", 0.0) <= 0:
        raise TraceInputError(None, f"FP8 {work} needs FP8 tensor cores; {hw.name} ({hw.gpu.model}) has none: "
                                    "use --precision bf16")
    if fp8_recipe == "mxfp8" and "mxfp8" not in hw.gpu.block_scaled_formats:
        raise TraceInputError(None, f"the mxfp8 recipe needs tensor cores with MX block scaling (Blackwell); "
                                    f"{hw.name} ({hw.gpu.model}) has none: use tensorwise, delayed or blockwise")
