"""Tests of the healer's strategy channel in the python client (slo_probe.on_strategy): the file
the agent writes, callbacks at step boundaries, client.json and ack.json.
Run: cd python && python3 -m unittest discover -s tests -v
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import unittest
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import slo_probe  # noqa: E402
from slo_probe import _strategy  # noqa: E402


class StrategyChannel(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        os.environ["SLO_PROBE_JOBS_DIR"] = self.tmp.name
        self.dir = os.path.join(self.tmp.name, str(os.getpid()))
        os.makedirs(self.dir)
        _strategy._clear()
        slo_probe._set_backend(None)

    def tearDown(self) -> None:
        _strategy._clear()
        os.environ.pop("SLO_PROBE_JOBS_DIR", None)
        self.tmp.cleanup()

    def write(self, seq: int, strategies: Dict[str, Any]) -> None:
        path = os.path.join(self.dir, "strategy.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"version": 1, "seq": seq, "strategies": strategies}, f)
        os.replace(path + ".tmp", path)

    def read(self, name: str) -> Dict[str, Any]:
        with open(os.path.join(self.dir, name)) as f:
            return json.load(f)

    def test_callbacks_run_at_step_boundaries_and_are_acknowledged(self) -> None:
        seen: List[Optional[Dict[str, Any]]] = []
        slo_probe.on_strategy("graph-replay", seen.append)
        self.assertEqual(self.read("client.json"), {"pid": os.getpid(), "strategies": ["graph-replay"]})
        with slo_probe.step():
            pass
        self.assertEqual(seen, [])
        self.write(1, {"graph-replay": {"replay": False}, "comm-relief": {"sync_every": 2}})
        self.assertEqual(_strategy.poll(force=True), ["graph-replay"])
        self.assertEqual(seen, [{"replay": False}])
        self.assertEqual(self.read("ack.json"), {"seq": 1, "applied": ["graph-replay"], "errors": {}})
        # Unchanged file: nothing runs again.
        self.assertEqual(_strategy.poll(force=True), [])
        # Removed: back to what the script did before.
        self.write(2, {})
        self.assertEqual(_strategy.poll(force=True), ["graph-replay"])
        self.assertEqual(seen, [{"replay": False}, None])

    def test_the_step_marker_polls_without_a_shim(self) -> None:
        seen: List[Optional[Dict[str, Any]]] = []
        slo_probe.on_strategy("io-boost", seen.append)
        self.write(1, {"io-boost": {"prefetch_factor": 4}})
        _strategy._last_check = 0.0
        with slo_probe.step():
            pass
        self.assertEqual(seen, [{"prefetch_factor": 4}])

    def test_a_raising_callback_is_reported_not_raised(self) -> None:
        def boom(_: Optional[Dict[str, Any]]) -> None:
            raise ValueError("no graphs here")

        slo_probe.on_strategy("graph-replay", boom)
        self.write(5, {"graph-replay": {"replay": True}})
        _strategy.poll(force=True)
        ack = self.read("ack.json")
        self.assertEqual(ack["seq"], 5)
        self.assertIn("no graphs here", ack["errors"]["graph-replay"])

    def test_no_callbacks_no_file_access(self) -> None:
        self.write(1, {"graph-replay": {"replay": True}})
        self.assertEqual(_strategy.poll(force=True), [])
        self.assertFalse(os.path.exists(os.path.join(self.dir, "ack.json")))

    def test_fragmentation_rate(self) -> None:
        self.assertEqual(slo_probe.fragmentation_rate([]), 0.0)
        self.assertEqual(slo_probe.fragmentation_rate([100]), 0.0)
        self.assertAlmostEqual(slo_probe.fragmentation_rate([25, 25, 50]), 0.5)


if __name__ == "__main__":
    unittest.main()
