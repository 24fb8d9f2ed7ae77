"""The automatic step clock (slo_probe._autostep) against a recording fake shim and a stand-in for
torch's optimizer module; and the bootstrap (slo_probe/_boot/sitecustomize.py) in a subprocess,
with a stand-in torch on disk. Run: cd python && python3 -m unittest discover -s tests -v
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import types
import unittest
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
sys.path.insert(0, PKG)

import slo_probe  # noqa: E402
from slo_probe import _autostep  # noqa: E402
from test_slo_probe import FakeShim  # noqa: E402


def fake_optimizer_module() -> types.ModuleType:
    """torch.optim.optimizer as torch >= 2.0 has it: global post-hooks run after every step."""
    m = types.ModuleType("torch.optim.optimizer")
    hooks: Dict[int, Callable[..., Any]] = {}

    class Handle:
        def __init__(self, key: int) -> None:
            self.key = key

        def remove(self) -> None:
            hooks.pop(self.key, None)

    def register_optimizer_step_post_hook(hook: Callable[..., Any]) -> Handle:
        hooks[len(hooks)] = hook
        return Handle(len(hooks) - 1)

    class Optimizer:
        def step(self) -> None:
            for h in list(hooks.values()):
                h(self, (), {})

    m.register_optimizer_step_post_hook = register_optimizer_step_post_hook  # type: ignore[attr-defined]
    m.Optimizer = Optimizer  # type: ignore[attr-defined]
    m.hooks = hooks  # type: ignore[attr-defined]
    return m


class AutoStepTest(unittest.TestCase):
    def setUp(self) -> None:
        self.shim = FakeShim()
        slo_probe._set_backend(self.shim)
        self.shim.calls.clear()
        state = dict(_installed=False, _clock=None, _rival=None, _rival_steps=0, _open=None, _off=False, _handle=None)
        for name, value in state.items():
            setattr(_autostep, name, value)
        self.torch = fake_optimizer_module()
        self.assertTrue(_autostep.attach(self.torch))

    def tearDown(self) -> None:
        _autostep._disable()
        slo_probe._set_backend(None)

    def steps(self) -> List[Any]:
        return [c for c in self.shim.calls if c[0] in ("begin", "end")]

    def test_the_first_optimizer_is_the_clock(self) -> None:
        a, b = self.torch.Optimizer(), self.torch.Optimizer()
        for _ in range(3):
            a.step()
            b.step()  # a second optimizer (a GAN's) is not a clock
        self.assertEqual(
            self.steps(), [("begin", 0), ("end", 0), ("begin", 1), ("end", 1), ("begin", 2)]
        )
        self.assertEqual(_autostep.open_step(), 2)
        self.assertFalse(_autostep.attach(self.torch), "attached once")
        self.assertEqual(len(self.torch.hooks), 1)

    def test_an_optimizer_that_steps_twice_in_a_row_takes_over(self) -> None:
        # One job, then another in the same process (the first one's optimizer still alive).
        a, b = self.torch.Optimizer(), self.torch.Optimizer()
        for _ in range(3):
            a.step()
        for _ in range(4):
            b.step()  # its 2nd step in a row makes it the clock
        begun = [c[1] for c in self.steps() if c[0] == "begin"]
        self.assertEqual(begun, [0, 1, 2, 3, 4, 5])
        self.assertEqual(_autostep.open_step(), 5)

    def test_a_clock_that_was_collected_is_replaced(self) -> None:
        a = self.torch.Optimizer()
        a.step()
        del a
        b = self.torch.Optimizer()
        b.step()
        self.assertEqual(self.steps(), [("begin", 0), ("end", 0), ("begin", 1)])

    def test_the_scripts_own_markers_end_the_clock(self) -> None:
        a = self.torch.Optimizer()
        a.step()
        a.step()
        with slo_probe.step() as i:
            a.step()
        a.step()
        # The clock's open step 1 ends before the script's step 2 begins; then no more.
        self.assertEqual(i, 2)
        self.assertEqual(
            self.steps(), [("begin", 0), ("end", 0), ("begin", 1), ("end", 1), ("begin", 2), ("end", 2)]
        )
        self.assertEqual(self.torch.hooks, {}, "the hook is removed")

    def test_a_failing_clock_turns_itself_off_and_the_step_goes_on(self) -> None:
        def broken(_step: int) -> None:
            raise RuntimeError("shim gone")

        self.shim.slo_probe_step_begin = broken  # type: ignore[method-assign]
        slo_probe._set_backend(self.shim)
        a = self.torch.Optimizer()
        a.step()  # must not raise
        a.step()
        self.assertTrue(_autostep._off)
        self.assertEqual(self.torch.hooks, {})

    def test_without_a_shim_the_clock_only_counts(self) -> None:
        slo_probe._set_backend(None)
        a = self.torch.Optimizer()
        a.step()
        a.step()
        self.assertEqual(_autostep.open_step(), 1)
        self.assertEqual(self.shim.calls, [])

    def test_torch_without_global_hooks_is_said_and_left_alone(self) -> None:
        _autostep._installed = False
        old = types.ModuleType("torch.optim.optimizer")
        self.assertFalse(_autostep.attach(old))


FAKE_TORCH = {
    "torch/__init__.py": "from . import optim\n",
    "torch/optim/__init__.py": "from .optimizer import Optimizer\n",
    "torch/optim/optimizer.py": (
        "_hooks = {}\n"
        "def register_optimizer_step_post_hook(hook):\n    _hooks[len(_hooks)] = hook\n"
        "class Optimizer:\n    def step(self):\n        for h in list(_hooks.values()):\n"
        "            h(self, (), {})\n"
    ),
}

SCRIPT = """
import sys
before = 'slo_probe' in sys.modules
import torch
after_torch = 'slo_probe' in sys.modules
a = torch.optim.Optimizer()
for _ in range(4):
    a.step()
import os
sys.path.append(os.environ["SLO_PROBE_PYTHON"])
import slo_probe
print(before, after_torch, slo_probe._autostep.open_step())
"""


class BootstrapTest(unittest.TestCase):
    """The sitecustomize that `slo-probe run` puts first on PYTHONPATH, in a real interpreter."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="slo_probe_boot")
        for rel, text in FAKE_TORCH.items():
            path = os.path.join(self.dir, "lib", rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)

    def run_script(self, script: str, **env: str) -> subprocess.CompletedProcess:
        boot = os.path.join(PKG, "slo_probe", "_boot")
        e = {k: v for k, v in os.environ.items() if not k.startswith("SLO_PROBE")}
        e.update(
            PYTHONPATH=f"{boot}:{os.path.join(self.dir, 'lib')}",
            SLO_PROBE_PYTHON=PKG,
            SLO_PROBE_SHIM="none",
        )
        e.update(env)
        return subprocess.run([sys.executable, "-c", script], env=e, capture_output=True, text=True, timeout=60)

    def test_the_clock_starts_only_once_torch_imports_its_optimizers(self) -> None:
        p = self.run_script(SCRIPT)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.split(), ["False", "True", "3"], p.stderr)
        self.assertEqual(p.stderr, "")

    def test_auto_steps_0_installs_nothing(self) -> None:
        p = self.run_script(SCRIPT, SLO_PROBE_AUTO_STEPS="0")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.split(), ["False", "False", "None"], p.stderr)

    def test_a_script_that_never_imports_torch_never_imports_slo_probe(self) -> None:
        p = self.run_script("import sys, json; print('slo_probe' in sys.modules)")
        self.assertEqual(p.stdout.strip(), "False", p.stderr)

    def test_a_missing_package_is_said_and_torch_still_imports(self) -> None:
        p = self.run_script("import torch; torch.optim.Optimizer().step(); print('ran')", SLO_PROBE_PYTHON="/nonexistent")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), "ran")
        self.assertIn("slo_probe: no automatic step markers", p.stderr)


if __name__ == "__main__":
    unittest.main()
