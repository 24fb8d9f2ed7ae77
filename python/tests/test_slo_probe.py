"""Tests of the slo_probe package: no-op mode, the binding layer against a recording fake shim,
the ctypes declarations against a compiled stub (when a C compiler is present), and a real shim
(SLO_PROBE_SHIM, else the workspace build, else one built with cargo). Run: cd python && python3 -m unittest discover -s tests -v
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import types
import unittest
import warnings
from typing import Any, Dict, List, Optional, Tuple
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import slo_probe  # noqa: E402


class FakeShim:
    """The shim's ABI in Python: logs every call, keeps a per-thread op stack like the shim."""

    def __init__(self) -> None:
        self.calls: List[Tuple[Any, ...]] = []
        self.names: Dict[int, str] = {}
        self.stacks: Dict[int, List[int]] = {}
        self.underflows = 0
        self.intern_result: Optional[int] = None  # force a result (0 = failure)
        self.release_rc = 0
        self.reacquire_rc = 0
        self.bits = 1
        self._lock = threading.Lock()

    def _log(self, *call: Any) -> None:
        with self._lock:
            self.calls.append(call)

    def slo_probe_shim_version(self) -> int:
        self._log("version")
        return 1

    def slo_probe_step_begin(self, step: int) -> None:
        self._log("begin", step)

    def slo_probe_step_end(self, step: int) -> None:
        self._log("end", step)

    def slo_probe_intern_op(self, name: bytes) -> int:
        assert isinstance(name, bytes)
        self._log("intern", name.decode("utf-8"))
        with self._lock:
            op_id = len(self.names) + 1 if self.intern_result is None else self.intern_result
            if op_id:
                self.names[op_id] = name.decode("utf-8")
        return op_id

    def _stack(self) -> List[int]:
        return self.stacks.setdefault(threading.get_ident(), [])

    def slo_probe_op_push(self, op_id: int) -> None:
        self._log("push", op_id)
        self._stack().append(op_id)

    def slo_probe_op_pop(self) -> None:
        self._log("pop")
        st = self._stack()
        if st:
            st.pop()
        else:
            self.underflows += 1

    def slo_probe_cupti_release(self) -> int:
        self._log("release")
        if self.release_rc == 0:
            self.bits = 16
        return self.release_rc

    def slo_probe_cupti_reacquire(self) -> int:
        self._log("reacquire")
        if self.reacquire_rc == 0:
            self.bits = 1
        return self.reacquire_rc

    def slo_probe_status(self) -> int:
        return self.bits

    # What the shim would attribute a kernel launched now by this thread to.
    def launch(self) -> Optional[str]:
        st = self._stack()
        return self.names[st[-1]] if st else None

    def count(self, kind: str) -> int:
        return sum(1 for c in self.calls if c[0] == kind)

    def depth(self) -> int:
        return len(self._stack())


class FakeModule:
    """Just enough of torch.nn.Module for instrument(): named_modules, forward hooks, __call__
    with torch's always_call semantics (legacy=True: the torch < 2.1 signature)."""

    def __init__(self, forward: Any = None, legacy: bool = False, **children: "FakeModule") -> None:
        self.children = children
        self.legacy = legacy
        self._forward = forward
        self.pre_hooks: Dict[int, Any] = {}
        self.post_hooks: Dict[int, Tuple[Any, bool]] = {}
        self._next = 0

    def named_modules(self, prefix: str = ""):  # type: ignore[no-untyped-def]
        yield prefix, self
        for name, child in self.children.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def _handle(self, table: Dict[int, Any]) -> Any:
        self._next += 1
        key = self._next
        return types.SimpleNamespace(remove=lambda: table.pop(key, None)), key

    def register_forward_pre_hook(self, hook: Any) -> Any:
        handle, key = self._handle(self.pre_hooks)
        self.pre_hooks[key] = hook
        return handle

    def register_forward_hook(self, hook: Any, **kwargs: Any) -> Any:
        if self.legacy and kwargs:
            raise TypeError("register_forward_hook() got an unexpected keyword argument")
        handle, key = self._handle(self.post_hooks)
        self.post_hooks[key] = (hook, bool(kwargs.get("always_call")))
        return handle

    def hook_count(self) -> int:
        return (
            len(self.pre_hooks) + len(self.post_hooks) + sum(c.hook_count() for c in self.children.values())
        )

    def __call__(self, *args: Any) -> Any:
        for hook in list(self.pre_hooks.values()):
            hook(self, args)
        try:
            result = self._forward(self, *args) if self._forward else None
        except Exception:
            for hook, always in list(self.post_hooks.values()):
                if always:
                    hook(self, args, None)
            raise
        for hook, _ in list(self.post_hooks.values()):
            hook(self, args, result)
        return result


def fake_torch(compiling: List[bool]) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.compiler = types.SimpleNamespace(is_compiling=lambda: compiling[0])  # type: ignore[attr-defined]
    return torch


class Base(unittest.TestCase):
    def tearDown(self) -> None:
        slo_probe._set_backend(None)


class NoOpTest(Base):
    def setUp(self) -> None:
        slo_probe._set_backend(None)

    def test_locate_shim(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            ours = os.path.join(d, "libslo_probe_cupti.so")
            other = os.path.join(d, "libToolsInjection64.so")
            for p in (ours, other):
                open(p, "w").close()
            loc = slo_probe._locate_shim
            self.assertIsNone(loc({}))
            self.assertIsNone(loc({"CUDA_INJECTION64_PATH": "none"}))
            self.assertIsNone(loc({"CUDA_INJECTION64_PATH": os.path.join(d, "libslo_probe_missing.so")}))
            self.assertEqual(loc({"CUDA_INJECTION64_PATH": ours}), ours)
            self.assertIsNone(loc({"CUDA_INJECTION64_PATH": other}), "another tool's injection library")
            self.assertEqual(loc({"CUDA_INJECTION64_PATH": ours, "SLO_PROBE_SHIM": other}), other)
            self.assertIsNone(loc({"CUDA_INJECTION64_PATH": ours, "SLO_PROBE_SHIM": "none"}))
            with self.assertWarnsRegex(RuntimeWarning, "not a file"):
                self.assertIsNone(loc({"SLO_PROBE_SHIM": os.path.join(d, "nope.so")}))

    def test_everything_works_without_a_shim(self) -> None:
        self.assertFalse(slo_probe.available())
        self.assertIsNone(slo_probe.version())
        self.assertEqual(slo_probe.status(), {k: False for k in slo_probe.STATUS_FLAGS})
        with slo_probe.step() as i:
            self.assertEqual(i, 0)
        with slo_probe.step(10) as i:
            self.assertEqual(i, 10)
        with slo_probe.step() as i:
            self.assertEqual(i, 11)
        with slo_probe.op("matmul"), slo_probe.op("relu"):
            pass
        with slo_probe.cupti_released():
            pass
        self.assertTrue(slo_probe.cupti_reacquire())
        self.assertIsNone(slo_probe.depth())
        self.assertFalse(slo_probe.request_depth("nodes", 5))

    def test_cheap_without_a_shim(self) -> None:
        # No per-call state: every op() is one shared do-nothing object, instrument() adds no
        # hooks (so torch keeps its hook-free fast path), step() takes no shim calls.
        self.assertIs(slo_probe.op("a"), slo_probe.op("b"))
        model = FakeModule(up=FakeModule(), down=FakeModule())
        with mock.patch.dict(sys.modules, {"torch": fake_torch([False])}):
            handle = slo_probe.instrument(model)
        self.assertEqual(model.hook_count(), 0)
        handle.remove()

    def test_import_needs_no_torch(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("SLO_PROBE_SHIM", "CUDA_INJECTION64_PATH")}
        code = "import sys, slo_probe; slo_probe.step(); slo_probe.op('x'); assert 'torch' not in sys.modules"
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=os.path.dirname(HERE), env=env, capture_output=True, text=True
        )
        self.assertEqual(out.returncode, 0, out.stderr)


class StepTest(Base):
    def setUp(self) -> None:
        self.shim = FakeShim()
        slo_probe._set_backend(self.shim)

    def test_begin_end_pairs_and_auto_increment(self) -> None:
        for _ in range(3):
            with slo_probe.step():
                pass
        with slo_probe.step(100):
            pass
        with slo_probe.step() as i:
            self.assertEqual(i, 101)
        self.assertEqual(
            self.shim.calls,
            [
                ("begin", 0),
                ("end", 0),
                ("begin", 1),
                ("end", 1),
                ("begin", 2),
                ("end", 2),
                ("begin", 100),
                ("end", 100),
                ("begin", 101),
                ("end", 101),
            ],
        )

    def test_counter_wraps_like_uint64(self) -> None:
        with slo_probe.step((1 << 64) - 1):
            pass
        with slo_probe.step() as i:
            self.assertEqual(i, 0)

    def test_end_on_exception(self) -> None:
        with self.assertRaises(KeyError):
            with slo_probe.step():
                raise KeyError("boom")
        self.assertEqual(self.shim.calls, [("begin", 0), ("end", 0)])

    def test_decorator(self) -> None:
        @slo_probe.step
        def train_a() -> str:
            return "a"

        @slo_probe.step()
        def train_b() -> None:
            raise ValueError

        self.assertEqual(train_a(), "a")
        self.assertEqual(train_a.__name__, "train_a")
        with self.assertRaises(ValueError):
            train_b()
        self.assertEqual(self.shim.calls, [("begin", 0), ("end", 0), ("begin", 1), ("end", 1)])

    def test_bad_use(self) -> None:
        for bad in (-1, 1 << 64):
            with self.assertRaises(ValueError):
                slo_probe.step(bad)
        marker = slo_probe.step()
        with marker:
            with self.assertRaises(RuntimeError):
                marker.__enter__()
        with marker:  # sequential reuse is fine
            pass
        self.assertEqual(self.shim.calls, [("begin", 0), ("end", 0), ("begin", 1), ("end", 1)])

    def test_threads_get_distinct_indices(self) -> None:
        seen: List[int] = []
        lock = threading.Lock()

        def work() -> None:
            for _ in range(500):
                with slo_probe.step() as i:
                    with lock:
                        seen.append(i)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(sorted(seen), list(range(4000)))
        begins = sorted(c[1] for c in self.shim.calls if c[0] == "begin")
        ends = sorted(c[1] for c in self.shim.calls if c[0] == "end")
        self.assertEqual(begins, list(range(4000)))
        self.assertEqual(ends, begins)

    def test_end_goes_to_the_shim_that_saw_begin(self) -> None:
        with slo_probe.step():
            slo_probe._set_backend(None)
        self.assertEqual(self.shim.calls, [("begin", 0), ("end", 0)])


class OpTest(Base):
    def setUp(self) -> None:
        self.shim = FakeShim()
        slo_probe._set_backend(self.shim)

    def test_interned_once_push_pop_balanced(self) -> None:
        for _ in range(3):
            with slo_probe.op("attention"):
                self.assertEqual(self.shim.launch(), "attention")
                with slo_probe.op("softmax"):
                    self.assertEqual(self.shim.launch(), "softmax")
                self.assertEqual(self.shim.launch(), "attention")
        self.assertEqual(
            [c for c in self.shim.calls if c[0] == "intern"], [("intern", "attention"), ("intern", "softmax")]
        )
        self.assertEqual(self.shim.count("push"), 6)
        self.assertEqual(self.shim.count("pop"), 6)
        self.assertEqual(self.shim.depth(), 0)

    def test_pop_on_exception(self) -> None:
        with self.assertRaises(ZeroDivisionError):
            with slo_probe.op("div"):
                1 / 0  # noqa: B018
        self.assertEqual(self.shim.depth(), 0)
        self.assertEqual(self.shim.count("pop"), 1)

    def test_utf8_and_bad_names(self) -> None:
        with slo_probe.op("attn·ü"):
            pass
        self.assertIn(("intern", "attn·ü"), self.shim.calls)
        with self.assertRaises(ValueError):
            slo_probe.op("a\0b")
        with self.assertRaises(TypeError):
            slo_probe.op(b"bytes")  # type: ignore[arg-type]

    def test_intern_failure_is_cached_and_silent(self) -> None:
        self.shim.intern_result = 0
        for _ in range(3):
            with slo_probe.op("full"):
                pass
        self.assertEqual(self.shim.calls, [("intern", "full")])

    def test_threads_intern_once(self) -> None:
        barrier = threading.Barrier(8)

        def work() -> None:
            barrier.wait()
            for _ in range(200):
                with slo_probe.op("shared"):
                    assert self.shim.launch() == "shared"

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(self.shim.count("intern"), 1)
        self.assertEqual(self.shim.count("push"), 1600)
        self.assertEqual(self.shim.count("pop"), 1600)
        self.assertTrue(all(not s for s in self.shim.stacks.values()))


class InstrumentTest(Base):
    def setUp(self) -> None:
        self.shim = FakeShim()
        slo_probe._set_backend(self.shim)
        self.compiling = [False]
        patcher = mock.patch.dict(sys.modules, {"torch": fake_torch(self.compiling)})
        patcher.start()
        self.addCleanup(patcher.stop)
        self.launched: List[Optional[str]] = []

    def kernel(self, _m: Any, *_a: Any) -> None:
        self.launched.append(self.shim.launch())

    def model(self, legacy: bool = False, fail_in: str = "") -> FakeModule:
        def leaf(name: str) -> Any:
            def fwd(m: Any, *a: Any) -> None:
                self.kernel(m)
                if name == fail_in:
                    raise RuntimeError(f"{name} failed")

            return fwd

        def block_fwd(m: Any, *a: Any) -> None:
            self.kernel(m)
            m.children["up"]()
            m.children["down"]()

        def root_fwd(m: Any, *a: Any) -> None:
            for b in m.children["blocks"].children.values():
                b()
            self.kernel(m)

        blocks = {
            str(i): FakeModule(
                block_fwd,
                legacy,
                up=FakeModule(leaf(f"{i}.up"), legacy),
                down=FakeModule(leaf(f"{i}.down"), legacy),
            )
            for i in range(2)
        }
        return FakeModule(root_fwd, legacy, blocks=FakeModule(None, legacy, **blocks))

    def test_attribution_by_qualified_name(self) -> None:
        model = self.model()
        handle = slo_probe.instrument(model)
        model()
        self.assertEqual(
            self.launched,
            [
                "blocks.0",
                "blocks.0.up",
                "blocks.0.down",
                "blocks.1",
                "blocks.1.up",
                "blocks.1.down",
                "FakeModule",
            ],
        )
        self.assertEqual(self.shim.depth(), 0)
        handle.remove()
        self.assertEqual(model.hook_count(), 0)
        self.launched.clear()
        model()
        self.assertEqual(self.launched, [None] * 7)

    def test_prefix_and_names_interned_once(self) -> None:
        model = self.model()
        with slo_probe.instrument(model, prefix="gpt"):
            model()
            model()
        self.assertEqual(self.launched[:2], ["gpt.blocks.0", "gpt.blocks.0.up"])
        self.assertEqual(self.launched[-1], "gpt")
        self.assertEqual(self.shim.count("intern"), 8)  # root, blocks, 2 blocks, 4 leaves
        self.assertEqual(model.hook_count(), 0)

    def test_balanced_when_forward_raises(self) -> None:
        for legacy in (False, True):
            with self.subTest(legacy_torch=legacy):
                shim = FakeShim()
                slo_probe._set_backend(shim)
                self.shim = shim
                model = self.model(legacy=legacy, fail_in="1.up")
                handle = slo_probe.instrument(model)
                with self.assertRaises(RuntimeError):
                    model()
                if legacy:  # pushes of the raising modules stay until the root runs again
                    self.assertEqual(shim.depth(), 3)  # root, blocks.1, blocks.1.up
                    model.children["blocks"].children["1"].children["up"]._forward = lambda m: None
                    model()
                self.assertEqual(shim.depth(), 0)
                self.assertEqual(shim.underflows, 0)
                self.assertEqual(shim.count("push"), shim.count("pop"))
                handle.remove()

    def test_parent_unwinds_a_child_that_raised(self) -> None:
        # torch < 2.1: the child's pop hook never runs; the parent catches, its pop unwinds both.
        def parent_fwd(m: Any) -> None:
            try:
                m.children["child"]()
            except RuntimeError:
                pass
            self.kernel(m)

        def child_fwd(m: Any) -> None:
            raise RuntimeError

        model = FakeModule(parent_fwd, True, child=FakeModule(child_fwd, True))
        slo_probe.instrument(model, prefix="p")
        with slo_probe.op("outer"):
            model()
            self.assertEqual(self.shim.launch(), "outer")
        self.assertEqual(self.launched, ["p.child"])  # documented limitation: stale until the pop
        self.assertEqual(self.shim.depth(), 0)
        self.assertEqual(self.shim.count("push"), self.shim.count("pop"))

    def test_hooks_do_nothing_while_compiling(self) -> None:
        model = self.model()
        slo_probe.instrument(model)
        calls_before = len(self.shim.calls)
        self.compiling[0] = True
        model()
        self.assertEqual(len(self.shim.calls), calls_before)
        self.assertEqual(self.launched, [None] * 7)

    def test_each_thread_its_own_stack(self) -> None:
        model = self.model()
        slo_probe.instrument(model)
        errors: List[BaseException] = []

        def work() -> None:
            try:
                for _ in range(50):
                    model()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(self.launched), 4 * 50 * 7)
        self.assertEqual(self.launched.count("blocks.1.down"), 200)
        self.assertTrue(all(not s for s in self.shim.stacks.values()))


class CuptiReleasedTest(Base):
    def setUp(self) -> None:
        self.shim = FakeShim()
        slo_probe._set_backend(self.shim)

    def test_release_body_reacquire(self) -> None:
        with slo_probe.cupti_released():
            self.shim._log("body")
            self.assertEqual(slo_probe.status()["released"], True)
            self.assertEqual(slo_probe.status()["tracing"], False)
        self.assertEqual(self.shim.calls, [("release",), ("body",), ("reacquire",)])
        self.assertTrue(slo_probe.status()["tracing"])

    def test_reacquire_after_exception(self) -> None:
        with self.assertRaises(KeyError):
            with slo_probe.cupti_released():
                raise KeyError
        self.assertEqual(self.shim.calls, [("release",), ("reacquire",)])

    def test_release_failure_is_a_clear_error(self) -> None:
        self.shim.release_rc = 39
        body = []
        with self.assertRaisesRegex(
            RuntimeError, r"slo_probe_cupti_release\(\) returned 39.*CUDA_INJECTION64_PATH=none"
        ):
            with slo_probe.cupti_released():
                body.append(1)
        self.assertEqual(body, [])
        self.assertEqual(self.shim.calls, [("release",)])
        self.shim.release_rc = 0
        with slo_probe.cupti_released():  # the failed attempt left no state behind
            pass
        self.assertEqual(self.shim.calls[1:], [("release",), ("reacquire",)])

    def test_reacquire_failure_warns_and_keeps_the_body_exception(self) -> None:
        self.shim.reacquire_rc = 7
        with self.assertWarnsRegex(RuntimeWarning, r"returned 7.*cupti_reacquire\(\)"):
            with self.assertRaises(KeyError):
                with slo_probe.cupti_released():
                    raise KeyError
        self.shim.reacquire_rc = 0
        self.assertTrue(slo_probe.cupti_reacquire())
        self.assertTrue(slo_probe.status()["tracing"])

    def test_nested_releases_once(self) -> None:
        with slo_probe.cupti_released():
            with slo_probe.cupti_released():
                self.shim._log("body")
        self.assertEqual(self.shim.calls, [("release",), ("body",), ("reacquire",)])

    def test_status_flags(self) -> None:
        self.shim.bits = 1 | 2 | 4 | 8 | 16 | 32 | 64
        self.assertTrue(all(slo_probe.status().values()))
        self.shim.bits = 4
        self.assertEqual([k for k, v in slo_probe.status().items() if v], ["lost_race"])


CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


@unittest.skipUnless(CC, "no C compiler: the compiled-stub tests need one")
class CompiledStubTest(Base):
    """The real loading path (dlopen, argtypes, UTF-8 strings) against tests/stub_shim.c."""

    dir: str
    paths: Dict[int, str]

    @classmethod
    def cc(cls, source: str, out: str, *flags: str) -> str:
        path = os.path.join(cls.dir, out)
        subprocess.run([str(CC), "-shared", "-fPIC", "-O2", *flags, "-o", path, source], check=True)
        return path

    @classmethod
    def setUpClass(cls) -> None:
        cls.dir = tempfile.mkdtemp(prefix="slo_probe_stub")
        stub = os.path.join(HERE, "stub_shim.c")
        # One file per version: dlopen of a path already loaded returns the loaded library.
        cls.paths = {v: cls.cc(stub, f"libslo_probe_stub_v{v}.so", f"-DSTUB_VERSION={v}") for v in (1, 2)}

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.dir, ignore_errors=True)

    def stub(self) -> ctypes.CDLL:
        return ctypes.CDLL(self.paths[1])  # the instance slo_probe loaded

    def log(self) -> str:
        lib = self.stub()
        lib.stub_log.restype = ctypes.c_char_p
        return str(lib.stub_log().decode("utf-8"))

    def test_calls_reach_the_library(self) -> None:
        with mock.patch.dict(os.environ, {"SLO_PROBE_SHIM": self.paths[1]}):
            slo_probe._init_from_env()
        self.assertTrue(slo_probe.available())
        self.assertEqual(slo_probe.version(), 1)
        self.assertTrue(slo_probe.status()["tracing"])
        start = len(self.log())
        last = (1 << 64) - 1
        with slo_probe.step(last):
            with slo_probe.op("blocks.0.up·ü"):
                pass
        with slo_probe.cupti_released():
            self.assertTrue(slo_probe.status()["released"])
        self.assertEqual(
            self.log()[start:], f"begin {last};intern blocks.0.up·ü;push 1;pop;end {last};release;reacquire;"
        )

    def test_optional_functions_reach_the_library(self) -> None:
        slo_probe._install(slo_probe._load_shim(self.paths[1]))
        start = len(self.log())
        slo_probe._request_diagnostic(3)
        shim = slo_probe._shim
        assert shim is not None and shim.flush is not None
        shim.flush()
        self.assertEqual(self.log()[start:], "diagnostic 3;flush;")
        counters = slo_probe._debug_counters()
        assert counters is not None
        self.assertEqual(list(counters.values()), [1, 2])

    def test_depth_reaches_the_library(self) -> None:
        slo_probe._install(slo_probe._load_shim(self.paths[1]))
        start = len(self.log())
        self.assertEqual(
            slo_probe.depth(),
            {"depth": 0, "name": "timing", "reason": "sample", "window": 5, "period": 120, "unit": "steps"},
        )
        self.assertTrue(slo_probe.request_depth("kernels", 20))
        self.assertTrue(slo_probe.request_depth(0))
        self.assertTrue(slo_probe.request_depth(2, 3))
        self.assertEqual(self.log()[start:], "depth 1 20;depth 0 0;depth 2 3;")
        d = slo_probe.depth()
        assert d is not None
        self.assertEqual((d["depth"], d["name"], d["reason"]), (2, "nodes", "script"))
        for bad in (3, -1, "deep"):
            with self.assertRaises(ValueError):
                slo_probe.request_depth(bad)
        with self.assertRaises(ValueError):
            slo_probe.request_depth(1, 1 << 24)

    def test_release_error_code_from_the_library(self) -> None:
        slo_probe._install(slo_probe._load_shim(self.paths[1]))
        self.stub().stub_set_rc(-3, 0)
        try:
            with self.assertRaisesRegex(RuntimeError, "returned -3"):
                with slo_probe.cupti_released():
                    pass
        finally:
            self.stub().stub_set_rc(0, 0)

    def test_other_abi_version_means_no_op(self) -> None:
        with mock.patch.dict(os.environ, {"SLO_PROBE_SHIM": self.paths[2]}):
            with self.assertWarnsRegex(RuntimeWarning, "ABI version 2"):
                slo_probe._init_from_env()
        self.assertFalse(slo_probe.available())

    def test_not_a_shim_means_no_op(self) -> None:
        source = os.path.join(self.dir, "unrelated.c")
        with open(source, "w") as f:
            f.write("int unrelated(void) { return 0; }\n")
        path = self.cc(source, "libslo_probe_unrelated.so")
        with mock.patch.dict(os.environ, {"SLO_PROBE_SHIM": path}):
            with self.assertWarnsRegex(RuntimeWarning, "cannot use the shim"):
                slo_probe._init_from_env()
        self.assertFalse(slo_probe.available())


REPO = os.path.dirname(os.path.dirname(HERE))


def _real_shim() -> Tuple[Optional[str], str]:
    """The real shim for RealShimTest: SLO_PROBE_SHIM when set, else the workspace's build
    (target/debug or target/release), else one built now with cargo when cargo is on PATH.
    Returns (path, why not)."""
    named = os.environ.get("SLO_PROBE_SHIM", "")
    if named and named.lower() != "none":
        return (named, "") if os.path.isfile(named) else (None, f"SLO_PROBE_SHIM={named} is not a file")
    built = [os.path.join(REPO, "target", p, "libslo_probe_cupti.so") for p in ("debug", "release")]
    for path in built:
        if os.path.isfile(path):
            return path, ""
    cargo = shutil.which("cargo")
    if cargo is None or not os.path.isfile(os.path.join(REPO, "cupti-shim", "Cargo.toml")):
        return None, "no built libslo_probe_cupti.so and no cargo to build one"
    try:
        subprocess.run([cargo, "build", "-q", "-p", "slo-probe-cupti"], cwd=REPO, check=True, timeout=900)
    except (subprocess.SubprocessError, OSError) as e:
        return None, f"cargo build -p slo-probe-cupti failed: {e}"
    return (built[0], "") if os.path.isfile(built[0]) else (None, "cargo built no libslo_probe_cupti.so")


class RealShimTest(Base):
    """The real shim, loaded without CUDA: every function once. Fails (does not skip) when
    SLO_PROBE_SHIM names a missing file; skips only where no shim can be found or built."""

    path: str

    @classmethod
    def setUpClass(cls) -> None:
        path, why = _real_shim()
        if path is None:
            if os.environ.get("SLO_PROBE_SHIM"):
                raise AssertionError(why)
            raise unittest.SkipTest(why)
        cls.path = path

    def test_every_function_once(self) -> None:
        with mock.patch.dict(os.environ, {"SLO_PROBE_SHIM": self.path}):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                slo_probe._init_from_env()
        self.assertTrue(slo_probe.available())
        self.assertEqual(slo_probe.version(), 1)
        flags = slo_probe.status()
        self.assertIsInstance(flags, dict)
        self.assertEqual(set(flags), set(slo_probe.STATUS_FLAGS))
        with slo_probe.step():
            with slo_probe.op("slo_probe.test"):
                pass
        shim = slo_probe._shim
        assert shim is not None
        # Every optional function exists in the real shim.
        for name in slo_probe._OPTIONAL_ABI:
            self.assertIsNotNone(getattr(shim, name.replace("slo_probe_", ""), None), name)
        counters = slo_probe._debug_counters()
        assert counters is not None
        self.assertEqual(set(counters), set(slo_probe.DEBUG_COUNTERS))
        # The shim returns exactly as many counters as the package names.
        self.assertEqual(int(shim.debug_counters(None, 0)), len(slo_probe.DEBUG_COUNTERS))
        d = slo_probe.depth()
        assert d is not None
        self.assertEqual(set(d), {"depth", "name", "reason", "window", "period", "unit"})
        self.assertTrue(slo_probe.request_depth("kernels", 3))
        shim.flush()
        rc_release = shim.release()
        rc_reacquire = shim.reacquire()
        self.assertIsInstance(rc_release, int)
        self.assertIsInstance(rc_reacquire, int)
        print(
            f"\nreal shim {self.path}: status {flags}, release {rc_release}, reacquire {rc_reacquire}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    unittest.main()
