"""slo_probe: step markers, operator context and CUPTI hand-over for slo-probe's CUPTI shim.

A training script imports this package to talk to ``libslo_probe_cupti.so``, the shim that the
CUDA driver injects into the process when ``CUDA_INJECTION64_PATH`` names it. The shim records GPU
kernels; this package tells it where iterations start and end (``step``), which operator or
module launched a kernel (``op``, ``instrument``), and when to let ``torch.profiler`` have CUPTI
(``cupti_released``). Without the shim every function still works and does almost nothing, so
scripts need no ``if``.

Needs Python >= 3.9 and nothing else; ``instrument`` takes a ``torch.nn.Module`` (hooks that
still run when a forward raises need torch >= 2.1) and is the only function that touches torch.

Shim ABI (C, version 1): ``cupti-shim/include/slo_probe_shim.h`` declares every function with
its C signature; ``_ABI`` and ``_OPTIONAL_ABI`` below are its ctypes form (a test of the shim's
crate checks them against the header). Every function is non-blocking except release,
reacquire and flush, which flush CUPTI.

Finding the shim: ``SLO_PROBE_SHIM`` (any path; ``none`` turns this package into no-ops) wins
over ``CUDA_INJECTION64_PATH``. The latter is used only when its file name starts with
``libslo_probe`` (so that another tool's injection library, e.g. Nsight Systems', is never loaded
here) and is ignored when it is ``none`` or the file is missing. ``dlopen`` of the path the
driver uses returns the driver's instance, so both sides share the shim's state. Non-blocking
functions are called with the GIL held (``ctypes.PyDLL``): dropping it for a 50 ns call lets any
busy Python thread take it, and the training thread then waits for it to come back (see
tests/bench_overhead.py). Release and reacquire, which flush CUPTI, drop the GIL (``ctypes.CDLL``).
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
import threading
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, TypeVar, overload

from . import _autostep, _strategy
from ._strategy import allocator_fragmentation, compact_if_fragmented, fragmentation_rate, on_strategy

__all__ = [
    "DEPTHS",
    "STATUS_FLAGS",
    "allocator_fragmentation",
    "available",
    "compact_if_fragmented",
    "cupti_reacquire",
    "cupti_released",
    "depth",
    "fragmentation_rate",
    "instrument",
    "on_strategy",
    "op",
    "request_depth",
    "status",
    "step",
    "version",
]

#: Shim ABI version this package speaks.
ABI_VERSION = 1

#: Bits of ``slo_probe_status()`` and the keys ``status()`` gives them.
STATUS_FLAGS: Dict[str, int] = {
    "tracing": 1,  # subscribed to CUPTI
    "connected": 2,  # the agent is reading the shim's ring
    "lost_race": 4,  # another CUPTI subscriber (e.g. torch.profiler) was first
    "diagnostic": 8,  # node-level graph tracing (the agent asked for detail)
    "released": 16,  # CUPTI handed to another tool with cupti_released()
    "kernels": 32,  # every kernel is traced now (depth 1 or 2: a sample window or a request)
}

#: Tracing depths, by number: 0 timing (steps, graph launches, memcpy; kernels only in sample
#: windows), 1 kernels, 2 nodes (kernels, and CUDA-graph replays node by node).
DEPTHS = ("timing", "kernels", "nodes")
_REASONS = ("default", "sample", "agent", "script", "released")
_DEPTH_OFF = 0xFF

_U64_MAX = (1 << 64) - 1

# name -> (restype, argtypes, blocking), as in cupti-shim/include/slo_probe_shim.h. Blocking
# functions are called without the GIL.
_ABI: Dict[str, Tuple[Any, List[Any], bool]] = {
    "slo_probe_shim_version": (ctypes.c_int32, [], False),
    "slo_probe_step_begin": (None, [ctypes.c_uint64], False),
    "slo_probe_step_end": (None, [ctypes.c_uint64], False),
    "slo_probe_intern_op": (ctypes.c_uint32, [ctypes.c_char_p], False),
    "slo_probe_op_push": (None, [ctypes.c_uint32], False),
    "slo_probe_op_pop": (None, [], False),
    "slo_probe_cupti_release": (ctypes.c_int32, [], True),
    "slo_probe_cupti_reacquire": (ctypes.c_int32, [], True),
    "slo_probe_status": (ctypes.c_uint32, [], False),
}

# Functions the shim may lack (the test stub, older shims), same form as _ABI.
_OPTIONAL_ABI: Dict[str, Tuple[Any, List[Any], bool]] = {
    "slo_probe_request_diagnostic": (None, [ctypes.c_uint32], False),
    "slo_probe_debug_counters": (ctypes.c_size_t, [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t], False),
    "slo_probe_flush": (None, [], True),
    "slo_probe_request_depth": (ctypes.c_int32, [ctypes.c_uint32, ctypes.c_uint32], False),
    "slo_probe_depth": (ctypes.c_uint64, [], False),
}
_F = TypeVar("_F", bound=Callable[..., Any])


class _Shim:
    """The shim's functions, resolved once (a ctypes library or a test double)."""

    __slots__ = (
        "version",
        "step_begin",
        "step_end",
        "intern_op",
        "op_push",
        "op_pop",
        "release",
        "reacquire",
        "status",
        "request_diagnostic",
        "debug_counters",
        "flush",
        "request_depth",
        "depth",
    )

    def __init__(self, lib: Any, gil_free: Any = None) -> None:
        def fn(name: str, optional: bool = False) -> Any:
            table = _OPTIONAL_ABI if optional else _ABI
            src = gil_free if gil_free is not None and table[name][2] else lib
            return getattr(src, name, None) if optional else getattr(src, name)

        # Optional functions: absent in a stub or an older shim.
        self.request_diagnostic = fn("slo_probe_request_diagnostic", True)
        self.debug_counters = fn("slo_probe_debug_counters", True)
        self.flush = fn("slo_probe_flush", True)
        self.request_depth = fn("slo_probe_request_depth", True)
        self.depth = fn("slo_probe_depth", True)
        self.version = fn("slo_probe_shim_version")
        self.step_begin = fn("slo_probe_step_begin")
        self.step_end = fn("slo_probe_step_end")
        self.intern_op = fn("slo_probe_intern_op")
        self.op_push = fn("slo_probe_op_push")
        self.op_pop = fn("slo_probe_op_pop")
        self.release = fn("slo_probe_cupti_release")
        self.reacquire = fn("slo_probe_cupti_reacquire")
        self.status = fn("slo_probe_status")


def _locate_shim(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The shim's path from the environment, or None."""
    override = environ.get("SLO_PROBE_SHIM", "")
    if override.lower() == "none":
        return None
    if override:
        if os.path.isfile(override):
            return override
        warnings.warn(
            f"slo_probe: SLO_PROBE_SHIM={override} is not a file; running without the shim", RuntimeWarning
        )
        return None
    injected = environ.get("CUDA_INJECTION64_PATH", "")
    if not injected or injected.lower() == "none" or not os.path.isfile(injected):
        return None
    return injected if os.path.basename(injected).startswith("libslo_probe") else None


def _load_shim(path: str) -> _Shim:
    """Load the shim at ``path`` and declare its ABI; raises OSError/AttributeError/RuntimeError."""
    with_gil = ctypes.PyDLL(path)
    gil_free = ctypes.CDLL(path)
    for name, (restype, argtypes, blocking) in _ABI.items():
        f = getattr(gil_free if blocking else with_gil, name)
        f.restype = restype
        f.argtypes = argtypes
    for name, (restype, argtypes, blocking) in _OPTIONAL_ABI.items():
        f = getattr(gil_free if blocking else with_gil, name, None)
        if f is not None:
            f.restype = restype
            f.argtypes = argtypes
    shim = _Shim(with_gil, gil_free)
    got = shim.version()
    if got != ABI_VERSION:
        raise RuntimeError(f"shim ABI version {got}, this package speaks {ABI_VERSION}")
    return shim


# Module state. `_shim` is read without a lock on hot paths (one global read); `_install` resets
# everything derived from it. `_lock` guards the step counter and the op cache and is never held
# across a blocking call; `_release_lock` serialises release/reacquire.
_shim: Optional[_Shim] = None
_lock = threading.Lock()
_release_lock = threading.Lock()
_next_step = 0
_ops: Dict[str, "_OpContext"] = {}
_released_depth = 0
_tls = threading.local()


def _install(shim: Optional[_Shim]) -> None:
    global _shim, _next_step, _ops, _released_depth
    with _lock, _release_lock:
        _shim = shim
        _next_step = 0
        _ops = {}
        _released_depth = 0


def _set_backend(lib: Any) -> None:
    """Use ``lib`` as the shim (an object with the ABI's function names), or None for no-op mode.

    Internal hook for tests and embedders. Resets the step counter and the op-name cache.
    """
    _install(None if lib is None else _Shim(lib))


def _init_from_env() -> None:
    path = _locate_shim()
    shim = None
    if path is not None:
        try:
            shim = _load_shim(path)
        except (OSError, AttributeError, RuntimeError) as e:
            warnings.warn(f"slo_probe: cannot use the shim {path}: {e}; running without it", RuntimeWarning)
    _install(shim)


def available() -> bool:
    """True when the shim is loaded (otherwise every function here is a no-op)."""
    return _shim is not None


def version() -> Optional[int]:
    """The shim's ABI version, or None without a shim."""
    s = _shim
    return None if s is None else int(s.version())


def _request_diagnostic(steps: int) -> None:
    """Ask the shim for node-level CUDA-graph tracing during the next ``steps`` iterations."""
    s = _shim
    if s is not None and s.request_diagnostic is not None:
        s.request_diagnostic(max(1, int(steps)))


#: Names of the shim's debug counters, in ABI order.
DEBUG_COUNTERS = (
    "launches_driver", "launches_runtime", "kernel_records", "corr_hits", "corr_misses",
    "graph_records", "mem_records", "nodes_created", "nodes_cloned", "buffers_completed",
    "queue_dropped", "other_records", "node_ops_full", "graph_launches", "corr_hits_driver",
    "corr_hits_runtime", "launch_domains", "depth_changes", "toggle_ns", "sample_windows",
    "callback_ns", "sampled_steps", "incomplete_records", "forced_flushes",
    "corr_repeats",
    "holds",
    "drained_switches",
    "drain_timeouts",
    "quiet_switches",
)


def _debug_counters() -> Optional[Dict[str, int]]:
    """The shim's internal counters (launch callbacks, records, correlation hits), or None."""
    s = _shim
    if s is None or s.debug_counters is None:
        return None
    buf = (ctypes.c_uint64 * len(DEBUG_COUNTERS))()
    n = s.debug_counters(buf, len(DEBUG_COUNTERS))
    return {k: int(buf[i]) for i, k in enumerate(DEBUG_COUNTERS[: min(n, len(DEBUG_COUNTERS))])}


def depth() -> Optional[Dict[str, Any]]:
    """The shim's tracing depth and duty cycle, or None without a shim (or with one too old).

    ``{"depth": 0, "name": "timing", "reason": "sample", "window": 5, "period": 120,
    "unit": "steps"}``: the depth now (``name`` is one of DEPTHS, or "off" while CUPTI is
    released), why (default, sample, agent, script, released), and the sampling duty cycle of
    the always-on tier: kernels are traced for ``window`` out of every ``period`` steps (or ms
    when ``unit`` is "ms": the script marks no steps); period 0 means no sampling.
    """
    s = _shim
    if s is None or s.depth is None:
        return None
    w = int(s.depth())
    d, r = w & 0xFF, (w >> 8) & 0xFF
    return {
        "depth": d,
        "name": DEPTHS[d] if d < len(DEPTHS) else ("off" if d == _DEPTH_OFF else str(d)),
        "reason": _REASONS[r] if r < len(_REASONS) else str(r),
        "window": (w >> 16) & 0xFFFF,
        "period": (w >> 32) & 0x7FFFFFFF,
        "unit": "ms" if w >> 63 else "steps",
    }


def request_depth(level: Any, steps: int = 0) -> bool:
    """Ask the shim for tracing depth ``level`` (0/"timing", 1/"kernels", 2/"nodes") during the
    next ``steps`` iterations; 0 = until the next request. Level 0 withdraws the script's
    request (the shim goes back to its own tier and sampling). The agent's requests are kept
    apart: the shim runs at the higher of both. Returns True when the shim took the request,
    False without a shim (or with one too old). Never blocks.
    """
    if isinstance(level, str):
        if level not in DEPTHS:
            raise ValueError(f"slo_probe.request_depth(): level {level!r} is not one of {DEPTHS}")
        level = DEPTHS.index(level)
    level = int(level)
    if not 0 <= level < len(DEPTHS):
        raise ValueError(f"slo_probe.request_depth(): level {level} is outside 0..{len(DEPTHS) - 1}")
    steps = int(steps)
    if not 0 <= steps < 1 << 24:
        raise ValueError(f"slo_probe.request_depth(): steps {steps} is outside 0..2**24-1")
    s = _shim
    if s is None or s.request_depth is None:
        return False
    return int(s.request_depth(level, steps)) == 0


def status() -> Dict[str, bool]:
    """The shim's status flags by name (see STATUS_FLAGS); all False without a shim."""
    s = _shim
    bits = 0 if s is None else int(s.status())
    return {name: bool(bits & bit) for name, bit in STATUS_FLAGS.items()}


# ---------------------------------------------------------------------------------------------
# Iterations


def _take_step(index: Optional[int]) -> int:
    global _next_step
    with _lock:
        if index is None:
            index = _next_step
        _next_step = (index + 1) & _U64_MAX  # 2**64 - 1 wraps to 0, as in the shim's uint64_t
    return index


class _Step:
    __slots__ = ("_index", "_shim", "_current")

    def __init__(self, index: Optional[int]) -> None:
        self._index = index
        self._shim: Optional[_Shim] = None
        self._current: Optional[int] = None

    def __enter__(self) -> int:
        if self._current is not None:
            raise RuntimeError(
                "slo_probe.step(): this marker is already entered; use one step() per iteration"
            )
        a = _autostep
        if a._installed and not a._off:
            a.user_step_began()  # the script marks its own steps: the automatic clock stops
        i = _take_step(self._index)
        s = self._shim = _shim
        if s is not None:
            s.step_begin(i)
        self._current = i
        return i

    def __exit__(self, *exc: Any) -> None:
        s, i = self._shim, self._current
        self._shim = self._current = None
        if s is not None:
            s.step_end(i)  # the shim that saw begin, even if the backend changed meanwhile
        if _strategy._callbacks:
            _strategy.poll()  # the healer's job-side strategies, at the step boundary

    def __call__(self, fn: _F) -> _F:
        index = self._index

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _Step(index):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


@overload
def step(index: Optional[int] = None) -> _Step: ...
@overload
def step(index: _F) -> _F: ...
def step(index: Any = None) -> Any:
    """Mark one training iteration: ``with slo_probe.step(): ...`` (the block yields the index).

    ``index`` is the step number (0 <= index < 2**64); None takes the next one: 0 at start, else
    one after the last step begun by any thread. Each use calls the shim's begin once and end
    once, end also when the block raises. As a decorator (``@slo_probe.step`` or
    ``@slo_probe.step()``) each call of the function is one step.
    """
    if callable(index):
        return _Step(None)(index)
    if index is not None:
        index = int(index)
        if not 0 <= index <= _U64_MAX:
            raise ValueError(f"slo_probe.step(): index {index} is outside 0..2**64-1")
    return _Step(index)


# ---------------------------------------------------------------------------------------------
# Operator context


class _OpContext:
    """Pushes one interned op on enter, pops on exit; stateless, so one instance per name."""

    __slots__ = ("op_id",)

    def __init__(self, op_id: int) -> None:
        self.op_id = op_id

    def __enter__(self) -> None:
        s = _shim
        if s is not None and self.op_id:
            s.op_push(self.op_id)

    def __exit__(self, *exc: Any) -> None:
        s = _shim
        if s is not None and self.op_id:
            s.op_pop()


_NO_OP = _OpContext(0)


def _intern(name: str) -> _OpContext:
    ctx = _ops.get(name)
    if ctx is not None:
        return ctx
    if not isinstance(name, str):
        raise TypeError(f"slo_probe.op(): name must be str, not {type(name).__name__}")
    if "\0" in name:
        raise ValueError(f"slo_probe.op(): name {name!r} contains a NUL character")
    with _lock:
        ctx = _ops.get(name)
        if ctx is None:
            s = _shim
            op_id = int(s.intern_op(name.encode("utf-8"))) if s is not None else 0
            ctx = _OpContext(op_id) if op_id else _NO_OP  # 0 = failure: cached, not retried
            _ops[name] = ctx
    return ctx


def op(name: str) -> _OpContext:
    """``with slo_probe.op("attention"): ...`` attributes this thread's kernels to ``name``.

    Contexts nest; each name is interned once per process (the cache keeps every name seen, so
    use a bounded set of names). Without a shim, or when interning failed, it does nothing.
    """
    return _intern(name)


class InstrumentHandle:
    """Hooks registered by ``instrument``; ``remove()`` takes them all off."""

    def __init__(self) -> None:
        self.hooks: List[Any] = []

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks.clear()

    def __enter__(self) -> "InstrumentHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def _is_compiling_fn() -> Callable[[], bool]:
    torch = importlib.import_module("torch")
    fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)  # torch >= 2.3
    if fn is None:
        fn = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
    return fn if fn is not None else (lambda: False)


_Entry = Tuple[object, object]  # (instrument() call, hook pair)


def _stack() -> List[_Entry]:
    """This thread's pushes made by instrument() hooks, innermost last."""
    st: Optional[List[_Entry]] = getattr(_tls, "stack", None)
    if st is None:
        st = _tls.stack = []
    return st


def instrument(model: Any, prefix: str = "") -> InstrumentHandle:
    """Attribute kernels launched in each submodule's forward to its qualified name.

    Registers a forward pre-hook (push) and forward hook (pop) on every module of ``model``:
    ``blocks.0.up`` for a submodule, ``prefix.blocks.0.up`` with a ``prefix``, and ``prefix`` or
    the class name for ``model`` itself. Returns a handle; ``handle.remove()`` undoes it.

    Balance: the pop hook is registered with ``always_call=True`` (torch >= 2.1) so it also runs
    when forward raises. Each thread also keeps a stack of the pushes its hooks made: a pop hook
    unwinds every push made after its own (inner modules whose pop hook never ran), and the
    root's pre-hook discards pushes of this ``instrument`` left over from an earlier call.
    Limitations: on torch < 2.1, after a forward raised, kernels are attributed to the raising
    module until an enclosing module's forward returns or the root runs again, and an ``op()``
    block around such a failed forward pops the leftover instead of its own push; only forward is
    covered (backward kernels run on autograd's threads, without a context); inside torch.compile
    regions the hooks do nothing, so that Dynamo does not break the graph at them, and the shim
    falls back to CUDA-graph capture context and Inductor kernel names. Without a shim nothing is
    registered, so an uninstrumented model keeps torch's hook-free fast path.
    """
    handle = InstrumentHandle()
    if _shim is None:
        return handle
    is_compiling = _is_compiling_fn()
    call = object()
    for name, module in model.named_modules():
        if name:
            qualified = f"{prefix.rstrip('.')}.{name}" if prefix else name
        else:
            qualified = prefix.rstrip(".") or type(model).__name__
        op_id = _intern(qualified).op_id
        if op_id:
            handle.hooks.extend(_hook_module(module, op_id, call, not name, is_compiling))
    return handle


def _hook_module(
    module: Any, op_id: int, call: object, is_root: bool, is_compiling: Callable[[], bool]
) -> List[Any]:
    entry: _Entry = (call, object())

    def pre(_module: Any, _args: Any) -> None:
        if is_compiling():
            return
        s = _shim
        if s is None:
            return
        st = _stack()
        if is_root:
            while st and st[-1][0] is call:
                st.pop()
                s.op_pop()
        st.append(entry)
        s.op_push(op_id)

    def post(_module: Any, _args: Any, _result: Any) -> None:
        if is_compiling():
            return
        st = _stack()
        if entry not in st:  # pushed before the hooks existed, or already unwound
            return
        s = _shim
        while True:
            top = st.pop()
            if s is not None:
                s.op_pop()
            if top is entry:
                return

    try:
        post_handle = module.register_forward_hook(post, always_call=True)
    except TypeError:  # torch < 2.1
        post_handle = module.register_forward_hook(post)
    return [module.register_forward_pre_hook(pre), post_handle]


# ---------------------------------------------------------------------------------------------
# CUPTI hand-over


def _flags_text() -> str:
    on = [k for k, v in status().items() if v]
    return ", ".join(on) if on else "none"


@contextmanager
def cupti_released() -> Iterator[None]:
    """Hand CUPTI to another tool (torch.profiler) for the block, then take it back.

    The shim flushes its records and unsubscribes on entry; it subscribes again on exit, so
    start and stop the profiler inside the block. Raises RuntimeError, before the block runs,
    when the shim refuses to release. A failed reacquire is a RuntimeWarning (tracing stays off;
    retry with ``cupti_reacquire()``), so that it never hides an exception of the block. Nested
    and concurrent uses release once. Without a shim it only runs the block.
    """
    global _released_depth
    s = _shim
    if s is None:
        yield
        return
    with _release_lock:
        if _released_depth == 0:
            rc = int(s.release())
            if rc != 0:
                raise RuntimeError(
                    f"slo_probe: the CUPTI shim refused to release CUPTI "
                    f"(slo_probe_cupti_release() returned {rc}; status: {_flags_text()}). "
                    "torch.profiler would record no GPU activity. Run the profiler without the "
                    "shim (CUDA_INJECTION64_PATH=none) or check the shim's messages on stderr."
                )
        _released_depth += 1
    try:
        yield
    finally:
        with _release_lock:
            if _shim is s:  # else _install() reset the state meanwhile (tests)
                _released_depth -= 1
                if _released_depth == 0:
                    _reacquire(s)


def _reacquire(s: _Shim, stacklevel: int = 4) -> bool:
    rc = int(s.reacquire())
    if rc != 0:
        warnings.warn(
            f"slo_probe: the CUPTI shim could not take CUPTI back "
            f"(slo_probe_cupti_reacquire() returned {rc}; status: {_flags_text()}); GPU tracing "
            "stays off. Stop the profiler (leave its `with` block) before leaving "
            "cupti_released(), then call slo_probe.cupti_reacquire().",
            RuntimeWarning,
            stacklevel=stacklevel,
        )
        return False
    return True


def cupti_reacquire() -> bool:
    """Ask the shim to subscribe to CUPTI again; True on success or without a shim."""
    s = _shim
    return True if s is None else _reacquire(s, stacklevel=3)


_init_from_env()
