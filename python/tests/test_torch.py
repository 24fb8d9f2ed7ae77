"""instrument() against real torch (skipped where torch is not installed): qualified names, push/pop
balance when forward raises, autograd unaffected, no graph break under torch.compile(fullgraph=True),
and, on a CUDA machine, CUDA-graph capture with the hooks. Uses the recording fake shim.
"""

from __future__ import annotations

import importlib.util
import unittest
from typing import Any, List, Optional

from test_slo_probe import FakeShim  # first: it puts python/ on sys.path

import slo_probe  # noqa: E402

HAVE_TORCH = importlib.util.find_spec("torch") is not None

if HAVE_TORCH:
    import torch
    from torch import nn

    class Record(nn.Module):
        """Records the op the shim would attribute a kernel launched here to."""

        def __init__(self, log: List[Optional[str]], shim: FakeShim) -> None:
            super().__init__()
            self.log, self.shim = log, shim

        def forward(self, x: Any) -> Any:
            if not torch.compiler.is_compiling():
                self.log.append(self.shim.launch())
            return x

    class Block(nn.Module):
        def __init__(self, log: List[Optional[str]], shim: FakeShim, fail: bool = False) -> None:
            super().__init__()
            self.up = nn.Linear(8, 16)
            self.act = Record(log, shim)
            self.down = nn.Linear(16, 8)
            self.fail = fail

        def forward(self, x: Any) -> Any:
            h = self.act(self.up(x))
            if self.fail:
                raise RuntimeError("block failed")
            return x + self.down(h)

    class Net(nn.Module):
        def __init__(self, log: List[Optional[str]], shim: FakeShim, fail_at: int = -1) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block(log, shim, i == fail_at) for i in range(2))

        def forward(self, x: Any) -> Any:
            for b in self.blocks:
                x = b(x)
            return x


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TorchInstrumentTest(unittest.TestCase):
    def setUp(self) -> None:
        self.shim = FakeShim()
        slo_probe._set_backend(self.shim)
        self.log: List[Optional[str]] = []

    def tearDown(self) -> None:
        slo_probe._set_backend(None)

    def test_names_balance_and_backward(self) -> None:
        net = Net(self.log, self.shim)
        handle = slo_probe.instrument(net, prefix="net")
        loss = net(torch.randn(4, 8, requires_grad=True)).sum()
        loss.backward()
        self.assertEqual(self.log, ["net.blocks.0.act", "net.blocks.1.act"])
        names = {self.shim.names[c[1]] for c in self.shim.calls if c[0] == "push"}
        self.assertEqual(
            names,
            {"net", "net.blocks.0", "net.blocks.0.up", "net.blocks.0.act", "net.blocks.0.down"}
            | {"net.blocks.1", "net.blocks.1.up", "net.blocks.1.act", "net.blocks.1.down"},
        )
        self.assertEqual(self.shim.count("push"), self.shim.count("pop"))
        self.assertEqual(self.shim.depth(), 0)
        self.assertIsNotNone(next(net.parameters()).grad)
        handle.remove()
        calls = len(self.shim.calls)
        net(torch.randn(4, 8))
        self.assertEqual(len(self.shim.calls), calls)

    def test_balanced_when_forward_raises(self) -> None:
        net = Net(self.log, self.shim, fail_at=1)
        slo_probe.instrument(net)
        for _ in range(2):
            with self.assertRaisesRegex(RuntimeError, "block failed"):
                net(torch.randn(4, 8))
            self.assertEqual(self.shim.depth(), 0)
            self.assertEqual(self.shim.underflows, 0)
        self.assertEqual(self.shim.count("push"), self.shim.count("pop"))

    def test_no_graph_break_under_compile(self) -> None:
        net = Net(self.log, self.shim)
        slo_probe.instrument(net)
        compiled = torch.compile(net, backend="eager", fullgraph=True)  # a graph break raises
        x = torch.randn(4, 8)
        torch.testing.assert_close(compiled(x), net(x))
        self.assertEqual(self.shim.count("push"), self.shim.count("pop"))
        self.assertEqual(self.shim.depth(), 0)

    @unittest.skipUnless(HAVE_TORCH and torch.cuda.is_available(), "needs a CUDA device")
    def test_cuda_graph_capture_with_hooks(self) -> None:
        net = Net(self.log, self.shim).cuda()
        slo_probe.instrument(net)
        x = torch.randn(4, 8, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            net(x)  # warm-up
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        self.log.clear()
        with torch.cuda.graph(graph):
            y = net(x)
        self.assertEqual(self.log, ["blocks.0.act", "blocks.1.act"])  # context seen at capture
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, net(x))
        self.assertEqual(self.shim.depth(), 0)


if __name__ == "__main__":
    unittest.main()
