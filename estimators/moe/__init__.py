"""MoE routing what-if: routing traces (real or synthetic), expert placements, and what they cost.

- `routing`: the columnar routing form (`RoutingSource`: tokens x MoE layers x top-k expert ids, with
  optional gate scores, request domains and phases) and loaders for the formats found in the wild.
- `synthetic`: a seeded generator of skewed, domain-specific, drifting routing.
- `placement`: the registry of expert placements (contiguous, round-robin, balanced, eplb, locality).
- `evaluate`: per-layer all-to-all bytes (intra/inter node), GPU load, expert GEMM and all-to-all
  times, MoE layer latency, and the per-micro-batch loads the training workload generator takes.
"""
