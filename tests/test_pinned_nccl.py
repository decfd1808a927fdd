"""NCCL's bandwidth definitions and the bytes each collective algorithm puts on the wire, written out
from nccl-tests doc/PERFORMANCE.md (never the network model's own output).

nccl-tests PERFORMANCE.md: algbw = size / time; busbw = algbw x 2(n-1)/n for all-reduce (a ring sends
2(n-1)/n of the buffer per rank), x (n-1)/n for all-gather, reduce-scatter and all-to-all, x 1 for
broadcast / reduce. NVLink SHARP (NVLS) all-reduce: each GPU writes its buffer into the switch and reads
its reduced 1/n share back per direction (NVIDIA, "NVLink SHARP", NCCL 2.17 release notes).
"""
from __future__ import annotations

import pytest

from chakra_schema.graph import CommType
from replay.hardware.network import ALGORITHMS, CollectiveEstimate, NetworkModel

GB = 1e9


@pytest.mark.parametrize("comm,n,factor", [
    (CommType.ALL_REDUCE, 8, 2 * 7 / 8),
    (CommType.ALL_REDUCE, 64, 2 * 63 / 64),
    (CommType.ALL_GATHER, 8, 7 / 8),
    (CommType.REDUCE_SCATTER, 16, 15 / 16),
    (CommType.ALL_TO_ALL, 8, 7 / 8),
    (CommType.BROADCAST, 8, 1.0),
])
def test_busbw_is_algbw_times_the_nccl_tests_factor(comm, n, factor):
    """1 GB in 10 ms is algbw 100 GB/s; busbw = 100 x factor (all-reduce on 8: 175 GB/s)."""
    est = CollectiveEstimate(time_us=10_000.0, algorithm="ring", protocol="Simple", comm=comm,
                             size_bytes=1 * GB, nranks=n)
    assert est.algbw_gbps == pytest.approx(100.0, rel=1e-12)
    assert est.busbw_gbps == pytest.approx(100.0 * factor, rel=1e-12)


@pytest.mark.parametrize("comm,per_rank", [
    (CommType.ALL_REDUCE, 2 * 7 / 8),      # reduce-scatter pass + all-gather pass
    (CommType.ALL_GATHER, 7 / 8),
    (CommType.REDUCE_SCATTER, 7 / 8),
])
def test_ring_sends_the_bus_factor_of_the_buffer_per_rank(comm, per_rank):
    """A ring over 8 ranks of a 1 GiB buffer: every rank sends busbw-factor x 1 GiB (all-reduce 1.75 GiB)."""
    size = float(1 << 30)
    sent = ALGORITHMS["ring"]().bytes_sent_per_rank(comm, size, list(range(8)))
    assert sent == [pytest.approx(per_rank * size, rel=1e-12)] * 8


def test_nvls_all_reduce_sends_the_buffer_plus_its_reduced_share():
    """NVLS on 8 GPUs: S + S/8 per GPU and direction (1.125 GiB for 1 GiB), against a ring's 1.75 GiB."""
    size = float(1 << 30)
    assert ALGORITHMS["nvls"]().bytes_sent_per_rank(CommType.ALL_REDUCE, size, list(range(8))) == \
        [pytest.approx(1.125 * size)] * 8


@pytest.mark.parametrize("algo", ["direct", "pairwise"])
def test_all_to_all_sends_n_minus_1_over_n_of_the_buffer_per_rank(algo):
    """All-to-all of an S-byte send buffer on n=8 ranks: S/n to each of the 7 others = 7/8 S per rank."""
    size = 8.0 * 1024 * 1024
    sent = ALGORITHMS[algo]().bytes_sent_per_rank(CommType.ALL_TO_ALL, size, list(range(8)))
    assert sent == [pytest.approx(7 / 8 * size, rel=1e-12)] * 8


def test_bench_reports_algbw_and_busbw_by_the_same_definitions():
    """What `lumos-sim bench collective` prints: algbw = size / time, busbw = algbw x 2(n-1)/n."""
    est = NetworkModel("h100-sxm").estimate(CommType.ALL_REDUCE, float(1 << 30), 8)
    assert est.algbw_gbps == pytest.approx((1 << 30) / est.time_us / 1e3, rel=1e-12)
    assert est.busbw_gbps == pytest.approx(est.algbw_gbps * 2 * 7 / 8, rel=1e-12)


def test_bus_factor_of_one_and_two_ranks():
    """nccl-tests: a single rank moves nothing over the bus (factor 1 by convention, busbw = algbw);
    2 ranks: all-reduce 2 x 1/2 = 1, all-gather / reduce-scatter / gather / scatter 1/2."""
    from replay.hardware.network import bus_factor
    for comm in CommType:
        assert bus_factor(comm, 1) == 1.0 and bus_factor(comm, 0) == 1.0
    assert bus_factor(CommType.ALL_REDUCE, 2) == 1.0
    for comm in (CommType.ALL_GATHER, CommType.REDUCE_SCATTER, CommType.REDUCE_SCATTER_BLOCK, CommType.ALL_TO_ALL,
                 CommType.GATHER, CommType.SCATTER):
        assert bus_factor(comm, 2) == 0.5 and bus_factor(comm, 4) == 0.75
    assert bus_factor(CommType.BROADCAST, 2) == 1.0 and bus_factor(CommType.BARRIER, 4) == 1.0
