"""Strategy callbacks: the job side of slo-probe's healer.

The agent's healer puts job-side strategies in force by writing
``<jobs_dir>/<pid>/strategy.json`` atomically (``jobs_dir`` is ``SLO_PROBE_JOBS_DIR``, default
``/run/slo-probe/jobs``)::

    {"version": 1, "seq": 3, "strategies": {"graph-replay": {"replay": false}}}

A script registers what it can do with ``slo_probe.on_strategy(name, callback)``; this writes
``client.json`` (the names registered) so the agent knows a client is there. At every step
boundary (``slo_probe.step``) the file's identity (inode, mtime, size) is checked with one
``stat`` at most every 50 ms; when it changed, the callbacks of the strategies that appeared,
changed or disappeared are called on the training thread, at the boundary, with the
strategy's parameters (a dict) or ``None`` (back to what the script did before), and
``ack.json`` records what ran. Callbacks must not block for long: the training step waits.

Names: ``graph-replay`` ({"replay": bool}), ``comm-relief`` ({"sync_every": int}),
``io-boost`` ({"prefetch_factor": int}), ``memory-first`` ({"fragmentation_threshold": float,
"accumulation": int}).
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

Callback = Callable[[Optional[Dict[str, Any]]], None]

_CHECK_EVERY_S = 0.05
_ANNOUNCE_EVERY_S = 1.0

_lock = threading.Lock()
_callbacks: Dict[str, List[Callback]] = {}
_current: Dict[str, Any] = {}
_ident: Optional[Tuple[int, int, int]] = None
_last_check = 0.0
_last_announce = 0.0
_announced_pid = 0
_announced_names: Tuple[str, ...] = ()
_warned: set = set()


def _jobs_dir() -> str:
    return os.environ.get("SLO_PROBE_JOBS_DIR", "/run/slo-probe/jobs")


def _job_dir(pid: int) -> str:
    return os.path.join(_jobs_dir(), str(pid))


def _write_atomic(path: str, payload: Dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def _announce(now: float) -> None:
    """Writes client.json when the agent's directory for this process exists."""
    global _last_announce, _announced_pid, _announced_names
    pid = os.getpid()
    names = tuple(sorted(_callbacks))
    if _announced_pid == pid and _announced_names == names:
        return
    if now - _last_announce < _ANNOUNCE_EVERY_S and _announced_pid == pid:
        return
    _last_announce = now
    d = _job_dir(pid)
    if not os.path.isdir(d):
        return
    try:
        _write_atomic(os.path.join(d, "client.json"), {"pid": pid, "strategies": list(names)})
        _announced_pid, _announced_names = pid, names
    except OSError as e:
        _warn_once("announce", f"slo_probe: cannot write {d}/client.json: {e}")


def _warn_once(key: str, text: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(text, RuntimeWarning, stacklevel=3)


def on_strategy(name: str, callback: Callback) -> None:
    """Call ``callback(params)`` at a step boundary when the healer puts strategy ``name`` in
    force (``params``: a dict) or takes it away (``None``). Several callbacks may share a name."""
    if not callable(callback):
        raise TypeError("slo_probe.on_strategy(): callback must be callable")
    with _lock:
        _callbacks.setdefault(str(name), []).append(callback)
        _announce(time.monotonic() - _ANNOUNCE_EVERY_S)


def _clear() -> None:
    """Forget every callback and the state seen (tests)."""
    global _ident, _last_check, _last_announce, _announced_pid, _announced_names
    with _lock:
        _callbacks.clear()
        _current.clear()
        _ident = None
        _last_check = _last_announce = 0.0
        _announced_pid, _announced_names = 0, ()
        _warned.clear()


def poll(force: bool = False) -> List[str]:
    """Check the strategy file (at most every 50 ms unless ``force``) and run the callbacks of
    what changed; returns the names whose callbacks ran. Called by ``slo_probe.step``."""
    global _ident, _last_check
    if not _callbacks:
        return []
    now = time.monotonic()
    if not force and now - _last_check < _CHECK_EVERY_S:
        return []
    if not _lock.acquire(blocking=False):
        return []  # another thread is polling: never wait at a step boundary
    try:
        _last_check = now
        _announce(now)
        path = os.path.join(_job_dir(os.getpid()), "strategy.json")
        try:
            st = os.stat(path)
            ident: Optional[Tuple[int, int, int]] = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            ident = None
        if ident == _ident:
            return []
        _ident = ident
        wanted: Dict[str, Any] = {}
        seq = 0
        if ident is not None:
            try:
                with open(path, encoding="utf-8") as f:
                    doc = json.load(f)
                wanted = dict(doc.get("strategies", {}))
                seq = int(doc.get("seq", 0))
            except (OSError, ValueError) as e:
                _warn_once("read", f"slo_probe: cannot read {path}: {e}")
                _ident = None
                return []
        ran: List[str] = []
        errors: Dict[str, str] = {}
        for name in sorted(set(wanted) | set(_current)):
            new = wanted.get(name)
            if _current.get(name) == new or name not in _callbacks:
                continue
            for cb in _callbacks[name]:
                try:
                    cb(new)
                except Exception as e:  # noqa: BLE001 - a callback must never stop training
                    errors[name] = f"{type(e).__name__}: {e}"
            ran.append(name)
            if new is None:
                _current.pop(name, None)
            else:
                _current[name] = new
        if ran or errors:
            try:
                _write_atomic(
                    os.path.join(_job_dir(os.getpid()), "ack.json"),
                    {"seq": seq, "applied": ran, "errors": errors},
                )
            except OSError as e:
                _warn_once("ack", f"slo_probe: cannot write ack.json: {e}")
        return ran
    finally:
        _lock.release()


def fragmentation_rate(free_blocks: List[int]) -> float:
    """The seed's §3.1 fragmentation rate: 1 - largest free block / all free memory (0: one
    contiguous free region; towards 1: free memory in many small pieces)."""
    total = sum(free_blocks)
    if total <= 0:
        return 0.0
    return 1.0 - max(free_blocks) / total


def allocator_fragmentation() -> Optional[float]:
    """The fragmentation rate of PyTorch's CUDA caching allocator (free blocks of its reserved
    segments), or None without torch or CUDA."""
    try:
        import torch  # noqa: PLC0415 - optional

        if not torch.cuda.is_available():
            return None
        free = [
            int(b["size"])
            for seg in torch.cuda.memory_snapshot()
            for b in seg.get("blocks", [])
            if b.get("state") == "inactive"
        ]
    except Exception:  # noqa: BLE001 - diagnostics only
        return None
    return fragmentation_rate(free)


def compact_if_fragmented(threshold: float) -> bool:
    """Release the allocator's cached blocks (``torch.cuda.empty_cache``) when its fragmentation
    rate is above ``threshold``; True when it did. Call at a step boundary."""
    rate = allocator_fragmentation()
    if rate is None or rate <= threshold:
        return False
    import torch  # noqa: PLC0415

    torch.cuda.empty_cache()
    return True
