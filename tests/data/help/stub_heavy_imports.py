"""Stand-ins for heavy modules (torch, triton, ...) so that a server's argument parser can
be built on a CPU-only machine without them. Used by record_help.py only; never imported by
the project or its tests.

`install(["torch", "vllm.ir"])` puts a finder first on `sys.meta_path` that answers every
import of those names (and their submodules) with a module whose attributes are inert
stand-ins: callable, subclassable, falsy, equal to each other. The argument definitions of
SGLang and vLLM only need such modules to be importable; the parsers themselves are the
real ones.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterable
from typing import Any

#: attributes a stand-in must not pretend to have (copy, pydantic, inspect and device
#: probes look them up and take a different path when present)
_ABSENT = frozenset(
    {
        "npu",
        "musa",
        "hpu",
        "mlu",
        "_npu",
        "torch_npu",
        "_n",
        "__wrapped__",
        "__signature__",
        "__func__",
        "__self__",
        "__origin__",
        "__args__",
        "__parameters__",
        "__dataclass_fields__",
        "__get_validators__",
        "__set_name__",
        "__get__",
        "__set__",
        "__delete__",
        "__class_getitem__",
        "__fspath__",
        "__dict__",
        "__annotations__",
        "__module__",
        "__name__",
        "__qualname__",
        "__doc__",
        "__code__",
        "__defaults__",
        "__kwdefaults__",
        "__isabstractmethod__",
        "__objclass__",
        "__enter__",
        "__exit__",
        "__await__",
        "__aiter__",
        "__next__",
        "__reduce__",
        "__reduce_ex__",
        "__getstate__",
        "__length_hint__",
        "__complex__",
        "__round__",
        "__trunc__",
        "__floor__",
        "__ceil__",
        "__bytes__",
        "__format__",
        "__sizeof__",
        "__subclasshook__",
        "__instancecheck__",
        "__subclasscheck__",
        "__init_subclass__",
        "__prepare__",
        "__mro__",
        "__bases__",
        "__base__",
    }
)
_STR_METHODS = frozenset(
    {
        "split",
        "strip",
        "replace",
        "startswith",
        "endswith",
        "lower",
        "upper",
        "format",
        "join",
        "partition",
        "rsplit",
    }
)
_CLASSES: dict[str, type] = {}


class Stand:
    """An inert value standing for anything a stubbed module exports."""

    def __init__(self, name: str) -> None:
        self._n = name

    def __call__(self, *a: Any, **k: Any) -> Any:
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]  # used as a decorator
        return Stand(self._n + "()")

    def __getattr__(self, name: str) -> Any:
        if name in _ABSENT:
            raise AttributeError(name)
        if name in _STR_METHODS:
            return getattr("0 -> 0", name)
        return Stand(self._n + "." + name)

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type]:
        if self._n not in _CLASSES:
            _CLASSES[self._n] = type(
                self._n.rsplit(".", 1)[-1], (), {"__getattr__": lambda s, n: Stand(n)}
            )
        return (_CLASSES[self._n],)

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def __iter__(self) -> Any:
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __eq__(self, o: object) -> bool:
        return isinstance(o, Stand)

    def __ne__(self, o: object) -> bool:
        return not isinstance(o, Stand)

    def __hash__(self) -> int:
        return id(self)

    def __lt__(self, o: object) -> bool:
        return False

    __gt__ = __le__ = __ge__ = __lt__

    def __int__(self) -> int:
        return 0

    __index__ = __int__

    def __float__(self) -> float:
        return 1.0

    def __len__(self) -> int:
        return 0

    def __contains__(self, o: object) -> bool:
        return False

    def __str__(self) -> str:
        return "0"

    def __copy__(self) -> Stand:
        return self

    def __deepcopy__(self, memo: Any) -> Stand:
        return self

    def __getitem__(self, k: Any) -> Stand:
        return self

    def __add__(self, o: Any) -> Any:
        return o if isinstance(o, str) else self

    __radd__ = __add__

    def _same(self, *a: Any) -> Stand:
        return self

    __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _same
    __sub__ = __rsub__ = __pow__ = __rpow__ = __mod__ = __rmod__ = __and__ = __rand__ = _same
    __xor__ = __rxor__ = __lshift__ = __rshift__ = __neg__ = __pos__ = __abs__ = _same
    __invert__ = __matmul__ = __rmatmul__ = __or__ = __ror__ = _same


class _Module(types.ModuleType):
    __path__: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name in _ABSENT or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return Stand(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(names)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if any(name == n or name.startswith(n + ".") for n in self.names):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _Module(spec.name)
        module.__version__ = "2.9.1"  # type: ignore[attr-defined]  # torch's, for version checks
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install(names: Iterable[str]) -> None:
    sys.meta_path.insert(0, _Finder(names))
