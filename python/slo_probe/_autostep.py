"""Step markers for a script that has none: one iteration per ``optimizer.step()``.

``slo-probe run`` starts Python with its ``sitecustomize`` (``_boot/``) first on ``PYTHONPATH``;
that waits for ``torch.optim.optimizer`` to be imported (it imports neither torch nor this package
before) and then calls ``attach()``, which registers a global optimizer step post-hook (torch >=
2.0). The hook ends the open step and begins the next one each time the clock's optimizer steps,
so iteration ``i`` runs from the end of one ``optimizer.step()`` to the end of the next: the data
loading, forward and backward that lead to an update, and the update. The clock is the first
optimizer that steps; another one (a GAN's second) is not a clock while the clock steps between
its steps, and becomes the clock once it steps twice in a row (the first job of the process
ended and another began). With gradient accumulation an iteration is what leads to one update; a
step that ``GradScaler`` skips (inf found) does not call the hook, so that iteration runs into
the next.

Why: the shim's cheap tier (kernels traced only in sample windows, nothing between them) needs
to know where iterations start and end; without markers the kernels are the agent's iteration
clock and kernel tracing stays on (H100, 2026-12-07: +6.65% on a launch-bound eager job, +1.06%
on a GPU-bound one; ``bench/results/autostep-2026-12-07``).

A script's own markers win: the first ``slo_probe.step()`` ends the clock's open step and turns
the clock off for the rest of the process. ``SLO_PROBE_AUTO_STEPS=0`` keeps the bootstrap from
installing it. Nothing here may raise into the training job: a failure says one line on stderr
and leaves the job without the clock.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any, Optional

_lock = threading.Lock()
_installed = False
_clock: Optional["weakref.ReferenceType[Any]"] = None
_rival: Optional["weakref.ReferenceType[Any]"] = None
_rival_steps = 0
_open: Optional[int] = None
_off = False
_handle: Any = None


def _say(msg: str) -> None:
    try:
        sys.stderr.write(f"slo_probe: {msg}\n")
    except Exception:  # a closed stderr must not reach the job
        pass


def _hook(optimizer: Any, _args: Any, _kwargs: Any) -> None:
    """The global optimizer step post-hook: the step boundary of the clock's optimizer."""
    global _clock, _open, _rival, _rival_steps
    if _off:
        return
    try:
        import slo_probe
        from slo_probe import _strategy

        with _lock:
            if _off:
                return
            if _clock is None or _clock() is None:
                _clock, _rival, _rival_steps = weakref.ref(optimizer), None, 0
            elif _clock() is not optimizer:
                # Another optimizer: not a clock while the clock steps between its steps (a
                # GAN's second one); the clock once it steps twice in a row (the clock's job
                # ended and a new one began in the same process).
                if _rival is not None and _rival() is optimizer:
                    _rival_steps += 1
                else:
                    _rival, _rival_steps = weakref.ref(optimizer), 1
                if _rival_steps < 2:
                    return
                _clock, _rival, _rival_steps = _rival, None, 0
            else:
                _rival_steps = 0
            s = slo_probe._shim
            ended = _open
            _open = slo_probe._take_step(None)
            if s is not None:
                if ended is not None:
                    s.step_end(ended)
                s.step_begin(_open)
        if ended is not None and _strategy._callbacks:
            _strategy.poll()  # the healer's job-side strategies, at the step boundary
    except Exception as e:  # noqa: BLE001 - the training job comes first
        _disable(f"the automatic step clock failed ({e!r}) and is off")


def _disable(why: Optional[str] = None) -> None:
    global _off
    _off = True
    h = _handle
    if h is not None:
        try:
            h.remove()
        except Exception:
            pass
    if why:
        _say(why)


def user_step_began() -> None:
    """The script marks its own steps (``slo_probe.step()``): end the clock's open step and stop.

    Called from ``slo_probe.step()``'s enter, before it takes its index."""
    global _open
    if _off:
        return
    import slo_probe

    with _lock:
        ended, _open = _open, None
        s = slo_probe._shim
        if ended is not None and s is not None:
            s.step_end(ended)
    _disable()


def attach(module: Any) -> bool:
    """Register the clock's hook on ``module`` (``torch.optim.optimizer``, executed), once.

    The bootstrap calls it right after torch executes that module; True if this call registered
    it."""
    global _handle, _installed
    with _lock:
        if _installed or _off:
            return False
        reg = getattr(module, "register_optimizer_step_post_hook", None)
        if reg is None:
            _say("this torch has no register_optimizer_step_post_hook (torch < 2.0): no automatic step markers")
            return False
        _handle = reg(_hook)
        _installed = True
        return True


def open_step() -> Optional[int]:
    """The index of the step the clock has open, or None (for tests and reports)."""
    return _open
