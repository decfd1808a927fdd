"""MoE routing what-if: routing traces (real or synthetic), expert placements, and what they cost.

- `routing`: the columnar routing form (`RoutingSource`: tokens x MoE layers x top-k expert ids, with
  optional gate scores, request domains and phases) and loaders for the formats found in the wild.
- `synthetic`: a seeded generator of skewed, domain-specific, drifting routing.
- `placement`: the registry of expert placements (contiguous, round-robin, balanced, eplb, eplb-fallback,
  locality); `eplb`: DeepSeek's EPLB reimplemented to give the same maps.
- `grouped`: node-limited (group-limited) routing imposed on generated routing.
- `evaluate`: per-layer all-to-all bytes (intra/inter node), GPU load, expert GEMM and all-to-all
  times, MoE layer latency, and the per-micro-batch loads the training workload generator takes;
  `a2a`: the network model's non-uniform all-to-all, fast for EP groups of hundreds of GPUs.
- `serving`: tokens/s per GPU and node, time per output token of a deployment (attention incl. MLA,
  shared and routed experts, dispatch / combine, dual micro-batch overlap, MTP); `deployment`: the
  deployment TOML files (examples/deployments/).
"""
