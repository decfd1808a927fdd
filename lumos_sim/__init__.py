"""lumos-sim: trace-driven performance simulator for LLM training and MoE inference.

`lumos_sim.sweep(spec, ...)` runs a sweep (see `lumos_sim.sweeps`); it is imported on first use so that
`import lumos_sim` stays light."""
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "sweep":
        from lumos_sim.sweeps import sweep
        return sweep
    raise AttributeError(f"module 'lumos_sim' has no attribute '{name}'")
