"""Parallelism what-if: a model trained with a parallel plan on a hardware preset.

- `plan`: the parallel plan (TP, PP, DP, CP, EP, ZeRO, recompute, micro-batches) and its validation.
- `workload`: the plan -> a generated execution graph per simulated rank (compute, collectives, p2p).
- `memory`: memory per GPU (weights, gradients, optimizer state, activations).
- `evaluate`: the generated workload replayed with the hardware models -> step time, throughput, MFU.
- `search`: the analytic estimate that ranks every plan of a GPU count.
- `whatif`: the registration of the `parallelism` what-if.
"""
