"""`collect --routing`: router top-k of a PyTorch MoE module, recorded by forward hooks into the
parquet routing form. Needs torch and pyarrow (optional extras): skipped without them."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")

from estimators.moe.routing import load_routing  # noqa: E402
from lumos_sim.cli import main  # noqa: E402
from lumos_sim.collect_routing import RoutingRecorder  # noqa: E402

MOE_SOURCE = textwrap.dedent('''
    import torch

    class MoE(torch.nn.Module):
        """Top-k softmax router over small expert MLPs."""
        def __init__(self, hidden=16, experts=8, top_k=2):
            super().__init__()
            self.top_k = top_k
            self.gate = torch.nn.Linear(hidden, experts, bias=False)
            self.experts = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(experts))

        def forward(self, x):
            flat = x.reshape(-1, x.shape[-1])
            probs = torch.softmax(self.gate(flat), dim=-1)
            w, idx = torch.topk(probs, self.top_k, dim=-1)
            out = torch.zeros_like(flat)
            for j in range(self.top_k):
                for e in idx[:, j].unique().tolist():
                    rows = idx[:, j] == e
                    out[rows] += w[rows, j:j + 1] * self.experts[e](flat[rows])
            return out.reshape(x.shape)

    class Model(torch.nn.Module):
        def __init__(self, layers=3):
            super().__init__()
            self.blocks = torch.nn.ModuleList(MoE() for _ in range(layers))

        def forward(self, x):
            for b in self.blocks:
                x = x + b(x)
            return x
''')


def _model_namespace():
    ns: dict = {}
    exec(MOE_SOURCE, ns)  # noqa: S102 (the test's own model source)
    return ns


def test_recorder_hooks_every_router_and_matches_the_routers_own_top_k(tmp_path):
    torch.manual_seed(0)
    model = _model_namespace()["Model"]()
    x = torch.randn(2, 5, 16)
    expected = []
    h = x
    for b in model.blocks:  # the top-k each router picks, computed directly
        expected.append(torch.topk(torch.softmax(b.gate(h.reshape(-1, 16)), -1), 2).indices.numpy())
        h = h + b(h)
    with RoutingRecorder(model) as rec:
        model(x)
    assert rec.top_k == 2 and rec.names == ["blocks.0.gate", "blocks.1.gate", "blocks.2.gate"]
    rec.save(tmp_path / "routing")
    src = load_routing(tmp_path / "routing")
    ids = np.concatenate([c for _, c in src.chunks()])
    assert (src.tokens, src.layers, src.top_k) == (10, 3, 2)
    assert np.array_equal(ids, np.stack(expected, axis=1))


def test_collect_routing_cli_writes_parquet_the_moe_whatif_reads(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(MOE_SOURCE + textwrap.dedent('''
        torch.manual_seed(0)
        model = Model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def train_step(step):
            opt.zero_grad()
            model(torch.randn(4, 8, 16)).pow(2).mean().backward()
            opt.step()
    '''))
    out = tmp_path / "routing"
    assert main(["collect", str(script), "--routing", "--steps", "2", "-o", str(out)]) == 0
    assert "3 MoE layers x 64 tokens, top-2" in capsys.readouterr().out
    src = load_routing(out)
    assert (src.tokens, src.layers, src.top_k) == (64, 3, 2)
    assert sorted(p.name for p in out.iterdir()) == ["layer_000.parquet", "layer_001.parquet", "layer_002.parquet"]
