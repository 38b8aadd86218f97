"""The function under test: loading ``MODULE:FUNCTION``, calling it on tensors and checking what it returns.

``equiv`` and ``infer`` both run a black-box conversion function; :class:`Target` is how they call it (a dict or
positional tensors, results as a dict or a named tuple, the spec's parameters where the function takes them) and
:func:`load_function` imports it in a child process with a time limit (:mod:`layoutc.equiv.usercode`). Every
problem the user causes is an :class:`EquivError` (a message, never a traceback). Kept apart from the comparison
so that the inference, which has no spec yet, calls functions the same way.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

import attrs
import torch

from . import usercode


class EquivError(Exception):
    """A problem the user causes (bad MODULE:FUNCTION, a function that raises or returns the wrong
    thing, dims missing or invalid): reported as a message, never a traceback (CLI exit 2)."""


# ---------------------------------------------------------------------------
# the function under test


@attrs.frozen
class Target:
    """A conversion function and how to call it: ``fn(tensors)`` with a dict by default, positional
    tensors with ``args``; results as a dict, or a tuple named by ``returns``. A function that
    returns None is taken to have converted its dict in place (the dict is the result). A function
    with a parameter named ``params`` also gets the spec's parameters (``{"activation": "silu"}``)."""

    fn: Callable[..., Any]
    name: str
    args: tuple[str, ...] | None = None
    returns: tuple[str, ...] | None = None
    timeout: float | None = usercode.CALL_TIMEOUT  # seconds per call (:mod:`layoutc.equiv.usercode`)
    hard_exit: bool = False  # end the process when a call cannot be interrupted (the CLI)

    def wants_params(self) -> bool:
        try:
            return "params" in inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            return False

    def call(self, tensors: dict[str, torch.Tensor], params: Mapping[str, Any], where: str) -> dict[str, torch.Tensor]:
        kwargs = {"params": dict(params)} if self.wants_params() else {}
        in_bytes = sum(t.numel() * t.element_size() for t in tensors.values() if isinstance(t, torch.Tensor))

        def run():
            try:
                if self.args is not None:  # an optional input that is absent is passed as None
                    result = self.fn(*[tensors.get(a) for a in self.args], **kwargs)
                else:
                    result = self.fn(tensors, **kwargs)
            except EquivError:
                raise
            except Exception as err:  # noqa: BLE001 - the user's function: report, do not crash
                raise FunctionFailed(f"{self.name} raised {type(err).__name__}: {_short(str(err))} ({where})") from err
            try:  # reading the result runs the user's code too (a Mapping's items, a tensor subclass)
                return self._outputs(result, tensors, where, in_bytes)
            except EquivError:
                raise
            except Exception as err:  # noqa: BLE001
                raise EquivError(f"{self.name} returned something equiv cannot read ({where}): "
                                 f"{type(err).__name__}: {_short(str(err))}") from None

        try:
            return usercode.run(run, f"{self.name} ({where})", self.timeout, self.hard_exit)
        except usercode.Aborted as err:
            raise FunctionAborted(str(err)) from None

    def _outputs(self, result, tensors, where, in_bytes: int = 0) -> dict[str, torch.Tensor]:
        if result is None:
            if self.args is not None:
                raise EquivError(f"{self.name} returned None ({where}); with --args it must return its tensors")
            result = tensors  # converted in place
        if isinstance(result, (tuple, list)):
            if self.returns is None:
                raise EquivError(f"{self.name} returned a {type(result).__name__} of {len(result)} items ({where}); "
                                 f"name them with --returns NAME,NAME,... (returns=... in Python)")
            if len(result) != len(self.returns):
                raise EquivError(f"{self.name} returned {len(result)} items but --returns names {len(self.returns)}")
            result = dict(zip(self.returns, result))
        elif isinstance(result, torch.Tensor) and self.returns is not None and len(self.returns) == 1:
            result = {self.returns[0]: result}
        if not isinstance(result, Mapping):
            raise EquivError(f"{self.name} returned {type(result).__name__} ({where}); it must return a dict of "
                             f"tensors named as the spec's outputs (or a tuple named with --returns)")
        out = {}
        for k, v in result.items():
            if v is None:
                continue
            if not isinstance(k, str) or not isinstance(v, torch.Tensor):
                raise EquivError(f"{self.name} returned {{{_short(repr(k), 60)}: {type(v).__name__}}} ({where}); "
                                 f"expected tensor values under names")
            _check_usable(self.name, k, v, where, in_bytes)
            out[k] = v.detach().to("cpu").contiguous()
        return out


#: the most bytes an output may have, as a multiple of the inputs' bytes (a dequantizing conversion
#: widens fp4 to float32, 8x; padding to a block of a small test shape adds more), and at least
OUTPUT_FACTOR = 64
OUTPUT_FLOOR = 256 << 20


def _check_usable(fn: str, name: str, v: torch.Tensor, where: str, in_bytes: int) -> None:
    """A returned tensor equiv can read, bit for bit, without exhausting memory: a plain strided tensor
    with values (not meta, sparse, nested or quantized; not a subclass), of a size a conversion of the
    inputs can have (an expanded view of 1 TiB would be materialized by ``.contiguous()``)."""
    what = f"{fn} returned {_short(repr(name), 60)}"
    if type(v) not in (torch.Tensor, torch.nn.Parameter):
        raise EquivError(f"{what} as a {type(v).__name__} (a tensor subclass) ({where}); return plain tensors")
    if v.is_meta:
        raise EquivError(f"{what} as a meta tensor ({where}): it has a shape but no values to compare")
    if v.layout != torch.strided or v.is_nested or v.is_quantized:
        raise EquivError(f"{what} with layout {v.layout}{', nested' if v.is_nested else ''}"
                         f"{', quantized' if v.is_quantized else ''} ({where}); return dense (strided) tensors")
    nbytes = v.numel() * v.element_size()
    limit = max(OUTPUT_FLOOR, OUTPUT_FACTOR * in_bytes)
    if nbytes > limit:
        raise EquivError(f"{what} as {v.dtype}{list(v.shape)}, {nbytes / 2**30:.3g} GiB once materialized, from "
                         f"{in_bytes} bytes of inputs ({where}); a layout conversion returns about its inputs' size "
                         f"(at most {limit >> 20} MiB here)")


class FunctionFailed(EquivError):
    """The function raised."""


class FunctionAborted(EquivError):
    """The function (or the import of its module) exited or ran out of time: the run stops here."""


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_function(ref: str, timeout: float | None = usercode.CALL_TIMEOUT,
                  hard_exit: bool = False) -> tuple[Callable[..., Any], str]:
    """``package.module:function`` or ``path/to/file.py:function`` (``obj.attr`` paths allowed after the
    colon). The current directory is searched first, as ``python -m`` does. Runs the module's code."""
    module_name, sep, attr = ref.rpartition(":")
    if not sep or not module_name or not attr:
        raise EquivError(f"{ref!r}: expected MODULE:FUNCTION (e.g. mypkg.convert:process_weights, "
                         f"or path/to/file.py:convert)")
    try:
        if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
            path = Path(module_name)
            if not path.is_file():
                raise EquivError(f"{module_name}: no such file")
            spec = importlib.util.spec_from_file_location(f"_layoutc_against_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise EquivError(f"{module_name}: cannot be imported as a Python module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            usercode.run(lambda: spec.loader.exec_module(module), f"importing {module_name}", timeout, hard_exit)
        else:
            cwd = str(Path.cwd())
            if cwd not in sys.path:
                sys.path.insert(0, cwd)
            module = usercode.run(lambda: importlib.import_module(module_name), f"importing {module_name}",
                                  timeout, hard_exit)
    except EquivError:
        raise
    except usercode.Aborted as err:
        raise FunctionAborted(str(err)) from None
    except ModuleNotFoundError as err:
        raise EquivError(f"cannot import {module_name}: {err}") from None
    except Exception as err:  # noqa: BLE001 - the user's module code ran and failed
        raise EquivError(f"importing {module_name} failed: {type(err).__name__}: {_short(str(err))}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None))]
            from ..front.errors import suggest

            hint = suggest(part, names)
            raise EquivError(f"{module_name} has no {attr!r}" + (f" ({hint})" if hint else ""))
        obj = getattr(obj, part)
    if not callable(obj):
        raise EquivError(f"{ref} is a {type(obj).__name__}, not a function")
    return obj, ref


def as_target(fn: Callable[..., Any] | str | Target, args=None, returns=None,
              timeout: float | None = usercode.CALL_TIMEOUT, hard_exit: bool = False) -> Target:
    """``timeout``: seconds per call of the function and for the import of its module (None: no
    limit); ``hard_exit``: end the process when the code cannot be interrupted (:mod:`layoutc.equiv.usercode`)."""
    if isinstance(fn, Target):
        return fn
    if isinstance(fn, str):
        fn, name = load_function(fn, timeout, hard_exit)
    else:
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
        module = getattr(fn, "__module__", None)
        if module and module != "__main__" and "<lambda>" not in name:
            name = f"{module}:{name}"
    return Target(fn, name, tuple(args) if args else None, tuple(returns) if returns else None, timeout, hard_exit)
