"""slo-probe's Python bootstrap: ``slo-probe run`` puts this folder first on ``PYTHONPATH``.

Unless ``SLO_PROBE_AUTO_STEPS=0``, it waits for ``torch.optim.optimizer`` to be imported and then
starts the automatic step clock (``slo_probe._autostep``: one iteration per ``optimizer.step()``
for a script without ``slo_probe.step()`` markers). Nothing is imported before that, so a Python
process that never imports torch's optimizers pays one finder lookup per import. If
``slo_probe`` cannot be imported, ``SLO_PROBE_PYTHON`` (a folder that holds the package, set by
``slo-probe run``) is appended to ``sys.path`` (a ``slo_probe`` the environment has wins). Then it
runs the ``sitecustomize`` this one hides (the next one on ``sys.path``), so the environment's own
start-up code still runs. It never raises: a failure says one line on stderr.
"""


def _slo_probe_boot() -> None:
    import importlib.abc
    import importlib.util
    import os
    import sys

    target = "torch.optim.optimizer"

    def say(msg: str) -> None:
        try:
            sys.stderr.write(f"slo_probe: {msg}\n")
        except Exception:
            pass

    def attach(module: object) -> None:
        try:
            try:
                from slo_probe import _autostep
            except ImportError:
                extra = os.environ.get("SLO_PROBE_PYTHON", "")
                if not extra or extra in sys.path:
                    raise
                sys.path.append(extra)
                from slo_probe import _autostep
            _autostep.attach(module)
        except Exception as e:  # noqa: BLE001 - the training job comes first
            say(f"no automatic step markers ({e!r})")

    class Finder(importlib.abc.MetaPathFinder):
        """A one-shot: wraps the loader of torch.optim.optimizer so that attach runs after it."""

        def find_spec(self, name, path, target_module=None):  # type: ignore[no-untyped-def]
            if name != target:
                return None
            try:
                sys.meta_path.remove(self)
                spec = importlib.util.find_spec(name)
                loader = getattr(spec, "loader", None)
                run = getattr(loader, "exec_module", None)
                if run is None:
                    return spec

                def exec_module(module):  # type: ignore[no-untyped-def]
                    run(module)
                    # A loader may be shared by many modules (a zip archive's).
                    if getattr(module, "__name__", None) == target:
                        attach(module)

                loader.exec_module = exec_module  # type: ignore[union-attr]
                return spec
            except Exception as e:  # noqa: BLE001
                say(f"no automatic step markers ({e!r})")
                return None

    if os.environ.get("SLO_PROBE_AUTO_STEPS", "1").strip().lower() not in ("0", "false", "no", "off"):
        loaded = sys.modules.get(target)
        if loaded is not None:
            attach(loaded)
        else:
            sys.meta_path.insert(0, Finder())

    # The sitecustomize this one hides.
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in list(sys.path):
        try:
            folder = os.path.abspath(entry or os.getcwd())
            path = os.path.join(folder, "sitecustomize.py")
            if folder == here or not os.path.isfile(path):
                continue
            spec = importlib.util.spec_from_file_location("sitecustomize", path)
            if spec is None or spec.loader is None:
                return
            module = importlib.util.module_from_spec(spec)
            sys.modules["sitecustomize"] = module
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001
            say(f"the environment's sitecustomize failed ({e!r})")
        return


_slo_probe_boot()
del _slo_probe_boot
