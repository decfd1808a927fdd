"""Regenerate the sample routing traces in this folder from the project's seeded synthetic router
(`estimators.moe.synthetic`), so that the documented `whatif moe --routing` commands run on a fresh
clone:

    python examples/routing/make_samples.py  # doc-test: skip (rewrites the shipped samples in the checkout)

- `deepseek-v3.npy`: vLLM's routed-experts form, uint8 [1,024 tokens, 58 MoE layers, top-8] of DeepSeek-V3's
  256 experts (8 request domains, cluster affinity 0.5), 475 KB: with `--tokens 16` per GPU one EP32 batch
  fills each half (fit, evaluation);
- `tiny-moe/layer_<i>.parquet`: the form `lumos-sim collect --routing` writes, for the 4-layer, 8-expert,
  top-2 model of examples/train_moe.py (examples/moe/tiny-moe.toml), 2,048 tokens. Synthetic routing has
  no gate probabilities: `scores` holds 1/top_k for every pick.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from estimators.moe.synthetic import SyntheticSource, SyntheticSpec
from lumos_sim.collect_routing import write_routing_parquet

HERE = Path(__file__).resolve().parent


def routing(spec: SyntheticSpec) -> np.ndarray:
    """[tokens, layers, top_k] expert ids of the seeded synthetic source."""
    return np.concatenate([ids for _, ids in SyntheticSource(spec).chunks()], axis=0)


def main() -> int:
    ids = routing(SyntheticSpec(tokens=1024, layers=58, experts=256, top_k=8, domains=8, cluster_affinity=0.5,
                                request_tokens=32, seed=0))
    np.save(HERE / "deepseek-v3.npy", ids.astype(np.uint8))
    tiny = routing(SyntheticSpec(tokens=2048, layers=4, experts=8, top_k=2, domains=4, clusters=2,
                                 request_tokens=64, seed=0))
    layers = [tiny[:, i, :] for i in range(tiny.shape[1])]
    write_routing_parquet(HERE / "tiny-moe", layers, [np.full(a.shape, 0.5, np.float32) for a in layers],
                          [f"blocks.{i}.moe.gate" for i in range(len(layers))], top_k=2)
    print(f"wrote {HERE / 'deepseek-v3.npy'} {ids.shape} and {HERE / 'tiny-moe'} ({len(layers)} layers)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
