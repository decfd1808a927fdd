"""lumos-sim: trace-driven performance simulator for LLM training and MoE inference."""
__version__ = "0.1.0"
