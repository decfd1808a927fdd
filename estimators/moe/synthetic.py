"""Seeded synthetic routing with the structure real MoE routing shows (moe.md):

- per-layer skew: expert popularity follows a Zipf law whose exponent varies by layer;
- domain-specific popular experts: each domain (code, math, chat, general...) ranks the experts in its
  own order for `domain_share` of its picks, the rest follows one ranking shared by all domains;
- co-activation clusters: `cluster_affinity` of a token's picks come from one cluster of experts;
- prefill -> decode correlation: a request's decode tokens keep its prefill cluster with probability
  `decode_correlation` (so prefill routing predicts decode routing);
- drift: a growing share (up to `drift` at the end of the trace) of picks follows re-drawn rankings.

Tokens come in requests of `request_tokens` (the first `prefill_fraction` of them prefill), requests in
arrival order. Blocks of tokens are generated from `seed` and the block index alone, so any chunking
reads the same trace and a 1M-token trace streams in bounded memory.

`skew=0, cluster_affinity=0` gives uniformly random routing (balanced up to sampling noise);
`balanced=1` gives exactly balanced routing (every expert, and every rank pair of a batch whose
tokens x top-k divide by the experts, gets the same count), the case today's balanced EP path assumes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from chakra_schema.errors import TraceInputError

DOMAIN_NAMES = ("code", "math", "chat", "general", "multilingual", "science", "legal", "medical")
BLOCK = 65536
# Sizes checked before anything is allocated: per-token metadata (domain, phase, cluster and their
# temporaries, ~50 bytes a token) is held in memory, so 2^24 tokens is ~1 GiB; the per-layer tables
# are [layers, 65536] + [layers, 2 x domains + 1, experts].
MAX_TOKENS = 1 << 24
MAX_LAYERS = 1024
MAX_EXPERTS = 1 << 15   # picks are held as int16: a larger id wrapped negative (40,000 experts read as -32,768)
CACHE_BYTES = 256 << 20   # traces up to this size are generated once and kept


@dataclass(frozen=True)
class SyntheticSpec:
    tokens: int = 65536
    layers: int = 58
    experts: int = 256
    top_k: int = 8
    domains: int = 4
    skew: float = 1.0                  # Zipf exponent of expert popularity
    skew_jitter: float = 0.3           # per-layer exponent = skew * (1 +- jitter)
    domain_share: float = 0.8          # picks that follow the domain's own ranking (else the shared one)
    clusters: int = 0                  # co-activation clusters per layer (0: about experts / 8, dividing them)
    cluster_affinity: float = 0.25     # picks drawn from the token's cluster
    request_tokens: int = 256
    prefill_fraction: float = 0.5
    decode_correlation: float = 0.9
    drift: float = 0.2
    seed: int = 0
    balanced: int = 0                  # 1: exactly balanced routing, token t takes experts (t*top_k + j) mod experts

    def __post_init__(self) -> None:
        if self.clusters == 0:     # about experts / 8, a divisor of the experts (Qwen1.5-MoE's 60: 6)
            object.__setattr__(self, "clusters", max(c for c in range(1, max(1, self.experts // 8) + 1)
                                                     if self.experts % c == 0))
        for name in ("tokens", "layers", "experts", "top_k", "domains", "clusters", "request_tokens"):
            if getattr(self, name) < 1:
                raise TraceInputError(None, f"synthetic routing: {name} must be >= 1")
        # request_tokens: a request longer than the trace is the trace (numpy takes it as a C long)
        for name, cap in (("tokens", MAX_TOKENS), ("layers", MAX_LAYERS), ("experts", MAX_EXPERTS),
                          ("request_tokens", MAX_TOKENS)):
            if getattr(self, name) > cap:
                raise TraceInputError(None, f"synthetic routing: {name} must be at most {cap:,} (generated in memory), "
                                            f"got {getattr(self, name):,}")
        if self.top_k > self.experts:
            raise TraceInputError(None, "synthetic routing: top_k must not exceed experts")
        if self.domains > len(DOMAIN_NAMES):
            raise TraceInputError(None, f"synthetic routing: at most {len(DOMAIN_NAMES)} domains")
        if self.experts % self.clusters:
            raise TraceInputError(None, "synthetic routing: clusters must divide experts")
        for name in ("domain_share", "cluster_affinity", "prefill_fraction", "decode_correlation", "drift", "skew_jitter"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise TraceInputError(None, f"synthetic routing: {name} must be in [0, 1]")
        if self.balanced not in (0, 1):   # a switch: 5 or -1 read as "on" silently
            raise TraceInputError(None, f"synthetic routing: balanced must be 0 or 1, got {self.balanced}")
        if self.seed < 0:   # numpy's SeedSequence takes non-negative integers only
            raise TraceInputError(None, f"synthetic routing: seed must be >= 0, got {self.seed}")
        if not 0 <= self.skew < float("inf"):   # NaN fails this too
            raise TraceInputError(None, "synthetic routing: skew must be a finite number >= 0")

    @classmethod
    def parse(cls, text: str, **defaults) -> "SyntheticSpec":
        """`synthetic[:k=v,...]` (the CLI's --routing) -> spec; `defaults` fill what the text leaves out."""
        body = text.partition(":")[2]
        kw = dict(defaults)
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        for item in filter(None, (x.strip() for x in body.split(","))):
            k, sep, v = item.partition("=")
            if not sep or k not in types:
                raise TraceInputError(None, f"--routing synthetic: unknown setting '{item}' "
                                            f"(known: {', '.join(types)})")
            try:
                x = float(v)
                if types[k] in (int, "int"):
                    if not x.is_integer():   # 1e6 is a count, 2.5 or inf is not
                        raise ValueError
                    x = int(x) if abs(x) < 2**53 else int(v)
                kw[k] = x
            except (ValueError, OverflowError):
                raise TraceInputError(None, f"--routing synthetic: {k} expects "
                                            f"{'an integer' if types[k] in (int, 'int') else 'a number'}, got '{v}'") from None
        return cls(**kw)


class SyntheticSource:
    """A `RoutingSource` generated on the fly from a `SyntheticSpec`."""

    def __init__(self, spec: SyntheticSpec):
        self.spec = spec
        self.path = "synthetic:" + ",".join(f"{f.name}={getattr(spec, f.name)}" for f in dataclasses.fields(spec))
        self.tokens, self.layers, self.top_k = spec.tokens, spec.layers, spec.top_k
        self.domain_names = DOMAIN_NAMES[:spec.domains]
        self.domain, self.phase, self._cluster = self._requests()

    def _requests(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = self.spec
        rng = np.random.default_rng([s.seed, 1])
        n_req = -(-s.tokens // s.request_tokens)
        req_domain = rng.integers(0, s.domains, n_req)
        # each domain favours its own clusters: cluster = domain's slice + a random offset within it
        per_domain = max(s.clusters // s.domains, 1)
        req_cluster = (req_domain * per_domain + rng.integers(0, per_domain, n_req)) % s.clusters
        pos = np.arange(s.tokens) % s.request_tokens
        req = np.arange(s.tokens) // s.request_tokens
        phase = (pos >= int(round(s.prefill_fraction * s.request_tokens))).astype(np.uint8)
        keep = rng.random(s.tokens) < s.decode_correlation
        cluster = np.where((phase == 0) | keep, req_cluster[req], rng.integers(0, s.clusters, s.tokens))
        return req_domain[req].astype(np.int16), phase, cluster.astype(np.int32)

    @cached_property
    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per layer: Zipf rank of each 16-bit uniform value [L, 65536]; rankings [L, 2D+1, E] (domain d, shared, drifted d);
        cluster members [L, C, E/C]."""
        s = self.spec
        rng = np.random.default_rng([s.seed, 2])
        E, D = s.experts, s.domains
        exps = s.skew * (1 + s.skew_jitter * rng.uniform(-1, 1, s.layers))
        w = np.arange(1, E + 1, dtype=float)[None, :] ** -exps[:, None]
        rank_of = inverse_cdf_table(w)
        rankings = np.stack([np.stack([rng.permutation(E) for _ in range(2 * D + 1)]) for _ in range(s.layers)])
        members = np.stack([rng.permutation(E).reshape(s.clusters, E // s.clusters) for _ in range(s.layers)])
        return rank_of.astype(np.int32), rankings.astype(np.int32), members.astype(np.int32)

    def chunks(self, start: int = 0, stop: int | None = None, size: int = BLOCK):
        stop = self.tokens if stop is None else stop
        out, out_start = [], start
        for b in range(start // BLOCK, -(-stop // BLOCK)):
            lo, hi = b * BLOCK, min((b + 1) * BLOCK, self.tokens)
            block = self._block(b, lo, hi)
            a, z = max(lo, start), min(hi, stop)
            out.append(block[a - lo:z - lo])
            while sum(len(x) for x in out) >= size:
                cat = np.concatenate(out)
                yield out_start, cat[:size]
                out, out_start = [cat[size:]], out_start + size
        rest = np.concatenate(out) if out else np.zeros((0, self.layers, self.top_k), np.int16)
        if len(rest):
            yield out_start, rest

    def _block(self, b: int, lo: int, hi: int) -> np.ndarray:
        """Block b (tokens [lo, hi)); small traces keep their blocks, as they are read several times."""
        cache = self.__dict__.setdefault("_cache", {})
        if b in cache:
            return cache[b]
        out = self._generate(b, lo, hi)
        if self.tokens * self.layers * self.top_k * 2 <= CACHE_BYTES:
            cache[b] = out
        return out

    def _generate(self, b: int, lo: int, hi: int) -> np.ndarray:
        s = self.spec
        if s.balanced:
            ids = (np.arange(lo, hi)[:, None] * s.top_k + np.arange(s.top_k)[None, :]) % s.experts
            return np.repeat(ids[:, None, :], s.layers, axis=1).astype(np.int16)
        rng = np.random.default_rng([s.seed, 3, b])
        n, k, D = hi - lo, s.top_k, s.domains
        rank_of, rankings, members = self._tables
        domain = self.domain[lo:hi].astype(np.int64)
        cluster = self._cluster[lo:hi]
        t = (np.arange(lo, hi) + 0.5) / s.tokens
        out = np.empty((n, s.layers, k), np.int16)
        for layer in range(s.layers):
            out[:, layer] = self._layer_picks(rng, layer, n, k, D, domain, cluster, t, rank_of, rankings, members)
        return out

    def _layer_picks(self, rng, layer, n, k, D, domain, cluster, t, rank_of, rankings, members) -> np.ndarray:
        """One layer's top-k for n tokens. Two 32-bit draws per pick give: the Zipf rank (16 bits via the
        inverse-CDF table), cluster pick?, domain or shared ranking?, drifted ranking?, cluster member."""
        s = self.spec
        E = s.experts
        flat_rankings = rankings[layer].reshape(-1)
        cluster_flat = members[layer].reshape(-1)
        size = members.shape[2]
        thresholds = (np.uint32(s.cluster_affinity * 65536), np.uint32(s.domain_share * 65536))

        def draw(rows: np.ndarray, m: int) -> np.ndarray:
            r1 = rng.integers(0, 1 << 32, (len(rows), m), dtype=np.uint32)
            r2 = rng.integers(0, 1 << 32, (len(rows), m), dtype=np.uint32)
            ranks = rank_of[layer][r1 & 0xFFFF]
            which = np.where((r2 & 0xFFFF) < thresholds[1], domain[rows, None], D)
            drifted = (r2 >> 16).astype(np.float32) < (s.drift * 65536) * t[rows, None]
            which = np.where(drifted, D + 1 + domain[rows, None], which)
            zipf = flat_rankings[which * E + ranks]
            member = cluster_flat[cluster[rows, None] * size + ((r1 >> 16) * np.uint32(2654435761) >> 24) % size]
            return np.where((r1 >> 16) < thresholds[0], member, zipf)

        picks = draw(np.arange(n), k)
        # the layer's pick distribution over the experts (its shared ranking's), for a top-k past a quarter
        popularity = np.zeros(E)
        np.add.at(popularity, rankings[layer][D], np.bincount(rank_of[layer], minlength=E))
        return _distinct_per_row(picks, E, draw, rng, popularity)


def inverse_cdf_table(weights: np.ndarray) -> np.ndarray:
    """Per row of weights [L, E]: the index drawn for each of 65536 equally likely 16-bit uniform values
    (inverse CDF on a grid: sampling is one table lookup)."""
    cdf = np.cumsum(weights / weights.sum(1, keepdims=True), axis=1)
    cdf[:, -1] = 1.0
    grid = (np.arange(65536) + 0.5) / 65536
    return np.stack([np.minimum(np.searchsorted(c, grid), weights.shape[1] - 1) for c in cdf])


REDRAWS = 12   # redraws of a pick that repeats an expert of its row before the next free id is taken
PER_ROUND = 4  # redraws made at once per row (the first free one is kept): fewer, larger numpy calls


def _distinct_per_row(picks: np.ndarray, experts: int, redraw, rng: np.random.Generator,
                      popularity: np.ndarray) -> np.ndarray:
    """Make each row of picks [n, k] distinct, column by column: a pick equal to an earlier one of its row
    is drawn again (`redraw(rows, m)` -> m new picks per row) up to REDRAWS times, then takes the next expert
    id (cyclically) its row has not taken; from a quarter of the experts on, a row's remaining picks are drawn
    from its free experts without replacement in proportion to `popularity` [experts] (Gumbel top-k: exact
    for independent picks, one pass for all columns). A [n, experts] table of the ids taken so far makes each check
    one lookup, so the work grows with k, not k^2 (comparing every pair, then sorting every row, made a
    top-k of 16 to 128 take minutes)."""
    n, k = picks.shape
    base = np.arange(n) * experts
    taken = np.zeros(n * experts, bool)    # [n, experts], flat: one lookup per pick
    for j in range(k):
        if 4 * j >= experts:
            # Once a row holds a quarter of the experts (no model routes that widely: Mixtral and DBRX stop
            # before), redraws of a skewed router mostly clash again: the rest are drawn at once
            gumbel = -np.log(-np.log(rng.random((n, experts)) + 1e-300) + 1e-300)
            keys = np.log(popularity + 1e-30) + gumbel
            keys[taken.reshape(n, experts)] = -np.inf
            picks[:, j:] = np.argpartition(-keys, k - j - 1, axis=1)[:, :k - j]
            return picks
        col = picks[:, j].astype(np.int64)
        clash = np.flatnonzero(taken[base + col])
        for _ in range(REDRAWS // PER_ROUND):
            if not len(clash):
                break
            candidates = redraw(clash, PER_ROUND)                       # [clashing rows, PER_ROUND]
            free = ~taken[base[clash, None] + candidates]
            col[clash] = candidates[np.arange(len(clash)), free.argmax(axis=1)]
            clash = clash[~free.any(axis=1)]
        if len(clash):
            col[clash] = _next_free(taken.reshape(n, experts)[clash], col[clash])
        taken[base + col] = True
        picks[:, j] = col
    return picks


def _next_free(taken: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Per row of taken [m, experts]: the first id at or after start (cyclically) that is not taken."""
    candidates = (start[:, None] + np.arange(taken.shape[1])) % taken.shape[1]
    first_free = (~np.take_along_axis(taken, candidates, axis=1)).argmax(axis=1)
    return candidates[np.arange(len(start)), first_free]


class LoadSampledSource(SyntheticSource):
    """Routing sampled from known per-layer expert loads [layers][experts] (`--expert-load`): each token
    draws its top-k distinct experts in proportion to the layer's loads, independently per token and
    layer (no domains, co-activation or drift: only the loads are known)."""

    def __init__(self, loads: np.ndarray, top_k: int, tokens: int, seed: int = 0, path: str = "<loads>"):
        loads = np.asarray(loads, dtype=float)
        layers, experts = loads.shape
        super().__init__(SyntheticSpec(tokens=tokens, layers=layers, experts=experts, top_k=top_k, domains=1,
                                       skew=0.0, skew_jitter=0.0, domain_share=0.0, cluster_affinity=0.0,
                                       drift=0.0, seed=seed, clusters=1))
        self.path = path
        self.domain, self.domain_names = None, ()
        self._loads = loads

    @cached_property
    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        E = self.spec.experts
        rank_of = inverse_cdf_table(self._loads + 1e-12).astype(np.int32)
        identity = np.tile(np.arange(E, dtype=np.int32), (self.spec.layers, 3, 1))
        members = np.tile(np.arange(E, dtype=np.int32), (self.spec.layers, 1, 1))
        return rank_of, identity, members

    def _generate(self, b: int, lo: int, hi: int) -> np.ndarray:
        saved, self.domain = self.domain, np.zeros(self.tokens, np.int16)
        try:
            return super()._generate(b, lo, hi)
        finally:
            self.domain = saved
