"""What a worker lets its peers call: ``@rpc.expose`` and the ``[rpc] allow`` module patterns.

A callable travels as its import path (``"package.module:QualName"``). The receiving worker
resolves the path itself, and only to

* an object marked with :func:`expose` in a module that is already imported there (a peer never
  makes a worker import a module that way), or
* any public object of a module that matches one of the ``allow`` patterns (``"mypkg"`` allows
  ``mypkg`` and its submodules; ``"mypkg.*"`` only the submodules): these are imported on demand.

Methods are resolved through their class (``"mod:Counter.add"``): the class must be exposed (or
allowed) and the method public. Names with a leading underscore are never callable remotely.

In torch's compatibility mode (``[rpc] mode = "torch"``, :class:`Exposure` with ``program=True``)
every public or single-underscore function and class of the *program's own modules* is callable
too, without ``@rpc.expose``: ``__main__`` (the script) and the modules whose file lies under
the script's directory, outside any ``site-packages``; and torch's operators (the built-in
functions of the ``torch`` module, such as ``torch.add``: no Python code, no files). Dunder
names stay refused.

Allowed on every worker without configuration: the classes and functions *defined* in
``torch.nn`` and ``torch.optim`` (:data:`DEFAULT_ALLOW`; a name those modules merely import from
elsewhere is not), and the exposed helpers of rallypoint's own RPC modules
(:data:`BUILTIN_MODULES`, imported on demand), which distributed autograd, the distributed
optimizer and remote modules call.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from rallypoint.rpc.errors import RpcError, RpcRefused, SerializationError

__all__ = [
    "BUILTIN_MODULES",
    "DEFAULT_ALLOW",
    "Exposure",
    "allow_pattern_problem",
    "callable_path",
    "default_allowed",
    "expose",
    "is_exposed",
    "program_module",
]

_MARK = "__rallypoint_rpc_exposed__"
#: Module patterns whose own public classes and functions every worker accepts.
DEFAULT_ALLOW = ("torch.nn", "torch.optim")
#: rallypoint modules a worker imports on demand; only their ``@expose``-d objects are callable.
BUILTIN_MODULES = frozenset(
    {"rallypoint.rpc.optimizer", "rallypoint.rpc.remote_module", "rallypoint.rpc.rref_backward"}
)
T = TypeVar("T")


def expose(obj: T) -> T:
    """Let peers call a function, construct a class and call its public methods.

    Instances of an exposed class may also travel as values (as their state). Use it as a
    decorator::

        @rpc.expose
        class Counter: ...
    """
    try:
        setattr(obj, _MARK, True)
    except (AttributeError, TypeError):
        raise TypeError(f"cannot mark {obj!r} as exposed; wrap it in a function of your own") from None
    return obj


def is_exposed(obj: Any) -> bool:
    """Whether ``obj`` itself (not its class or a base class) is marked with :func:`expose`."""
    namespace = getattr(obj, "__dict__", None)
    return namespace is not None and bool(namespace.get(_MARK, False))


def callable_path(fn: Any) -> str:
    """The import path ``"module:QualName"`` of a function, class or method a peer can resolve.

    Raises:
        SerializationError: a lambda, a nested function or an object without a module.
    """
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise SerializationError(f"{fn!r} cannot be called remotely: it has no module and qualified name")
    name = getattr(fn, "__name__", None)
    if isinstance(name, str) and getattr(sys.modules.get(module), name, None) is fn:
        return f"{module}:{name}"  # builtins re-exported by their module (torch.add's qualname is private)
    if "<" in qualname:
        raise SerializationError(
            f"{module}.{qualname} cannot be called remotely: lambdas and nested functions have no import path; "
            "define it at module level and decorate it with @rpc.expose"
        )
    return f"{module}:{qualname}"


#: A module name (dot-separated, as ``sys.modules`` holds it), optionally followed by ``.*``.
_PATTERN = re.compile(r"[^.\s*:]+(\.[^.\s*:]+)*(\.\*)?")


def allow_pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is no ``allow`` pattern (it would match nothing), or ``None`` when it is one.

    >>> allow_pattern_problem("mypkg.*") is None, allow_pattern_problem("")[:30]
    (True, "'' is not a module pattern: wr")
    """
    if _PATTERN.fullmatch(pattern):
        return None
    shown = repr(pattern) if len(pattern) <= 60 else repr(pattern[:57]) + "..."
    return (
        f'{shown} is not a module pattern: write a module ("mypkg": it and its submodules) '
        'or "mypkg.*" (its submodules)'
    )


def _matches(module: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        return module.startswith(pattern[:-1])
    return module == pattern or module.startswith(pattern + ".")


def _default_module(module: Any) -> bool:
    return isinstance(module, str) and any(_matches(module, p) for p in DEFAULT_ALLOW)


def default_allowed(obj: Any) -> bool:
    """Whether ``obj`` is a class or function defined in a :data:`DEFAULT_ALLOW` module."""
    return (isinstance(obj, type) or inspect.isfunction(obj)) and _default_module(getattr(obj, "__module__", None))


def _program_root() -> str | None:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) if isinstance(path, str) else None


def _in_program(path: str | None, root: str | None) -> bool:
    if not isinstance(path, str) or root is None:
        return False
    full = os.path.abspath(path)
    return full.startswith(root + os.sep) and "site-packages" not in full.split(os.sep)


def program_module(name: str, *, root: str | None = None, find: bool = False) -> bool:
    """Whether module ``name`` belongs to the program: ``__main__``, or a file under the script's directory.

    Args:
        name: the module's name.
        root: the program's directory (default: that of the ``__main__`` script).
        find: look for a module not imported yet (without running it) instead of answering ``False``.
    """
    if name == "__main__":
        return True
    root = os.path.abspath(root) if root is not None else _program_root()
    module = sys.modules.get(name)
    if module is not None:
        return _in_program(getattr(module, "__file__", None), root)
    if not find or root is None:
        return False
    top = name.partition(".")[0]
    try:  # the top-level name first: finding it imports nothing, finding a submodule imports its parents
        top_spec = importlib.util.find_spec(top)
        if top_spec is None or not _in_program(top_spec.origin, root):
            return False
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and _in_program(spec.origin, root)


class Exposure:
    """The resolution rules of one worker (its ``allow`` patterns, torch's compatibility mode).

    Args:
        allow: module patterns whose public objects peers may call.
        everything: any importable public object (``serializer = "pickle"``).
        program: torch's compatibility mode: the program's own modules' functions and classes
            (single-underscore names included) need no ``@rpc.expose``.
        program_root: the program's directory (default: that of the ``__main__`` script).
    """

    def __init__(
        self,
        allow: Iterable[str] = (),
        *,
        everything: bool = False,
        program: bool = False,
        program_root: str | None = None,
    ) -> None:
        self.allow = tuple(allow)
        for pattern in self.allow:
            problem = allow_pattern_problem(pattern)
            if problem:
                raise RpcError(f"invalid [rpc] allow: {problem}")
        #: ``serializer = "pickle"``: any importable public object (a trusted cluster).
        self.everything = everything
        #: ``mode = "torch"``: the program's own modules are callable.
        self.program = program
        self.program_root = program_root

    def program_object(self, obj: Any) -> bool:
        """Whether ``obj`` is a function or class of the program's modules, callable in torch's mode."""
        return (
            self.program
            and (isinstance(obj, type) or inspect.isfunction(obj))
            and isinstance(getattr(obj, "__module__", None), str)
            and program_module(obj.__module__, root=self.program_root)
        )

    def allowed_module(self, module: str) -> bool:
        """Whether ``module`` matches an ``allow`` pattern."""
        return self.everything or any(_matches(module, p) for p in self.allow)

    def resolve(self, path: str, *, worker: str) -> Callable[..., Any]:
        """The object at ``path``, if this worker lets peers call it.

        Raises:
            RpcRefused: malformed path, private name, module not imported (and not allowed),
                object not exposed. Nothing is executed.
        """
        module_name, sep, qualname = path.partition(":")
        parts = qualname.split(".")
        if not sep or not module_name or not qualname or any(not p.isidentifier() for p in parts):
            raise RpcRefused(f"{worker} refused a call to {path!r}: not a 'module:QualName' path")
        program = self.program and program_module(module_name, root=self.program_root, find=True)
        private = "__" if program else "_"
        if any(p.startswith(private) for p in parts):
            raise RpcRefused(
                f"{worker} refused a call to {path}: names starting with {private!r} are never callable remotely"
            )
        if self.program and module_name == "torch" and len(parts) == 1:
            op = getattr(sys.modules.get("torch"), parts[0], None)
            if inspect.isbuiltin(op) and not parts[0].startswith("_"):  # an operator (torch.add), no Python code
                return op
        allowed = program or self.allowed_module(module_name)
        by_default = not allowed and _default_module(module_name)
        module = sys.modules.get(module_name)
        if module is None and module_name in BUILTIN_MODULES:
            module = importlib.import_module(module_name)
        if module is None:
            if not (allowed or by_default):
                raise RpcRefused(
                    f"{worker} refused a call to {path}: module {module_name} is not imported there and not in "
                    "[rpc] allow; import it before init_rpc or add it to [rpc] allow"
                )
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise RpcRefused(f"{worker} cannot import {module_name} for {path}: {exc}") from None
        fn: Callable[..., Any] = self._walk(module, parts, path, allowed=allowed or by_default, worker=worker)
        if by_default and not _default_module(getattr(fn, "__module__", None)):
            raise RpcRefused(
                f"{worker} refused a call to {path}: it is defined in {getattr(fn, '__module__', None)}, outside "
                f"the modules allowed by default ({', '.join(DEFAULT_ALLOW)}); list its module in [rpc] allow"
            )
        return fn

    def _walk(self, module: Any, parts: list[str], path: str, *, allowed: bool, worker: str) -> Any:
        obj: Any = module
        exposed_owner = False
        for i, part in enumerate(parts):
            obj = getattr(obj, part, None)
            if obj is None:
                raise RpcRefused(f"{worker} refused a call to {path}: {'.'.join(parts[: i + 1])} does not exist there")
            if i < len(parts) - 1:
                if not isinstance(obj, type):
                    raise RpcRefused(f"{worker} refused a call to {path}: only class attributes can be named")
                exposed_owner = exposed_owner or is_exposed(obj)
        if allowed or is_exposed(obj) or exposed_owner:
            if not callable(obj):
                raise RpcRefused(f"{worker} refused a call to {path}: it is not callable")
            return obj
        root = self.program_root or _program_root()
        where = f' (mode = "torch" opens only the program\'s modules: __main__ and those under {root})'
        where = where if self.program else ""
        raise RpcRefused(
            f"{worker} refused a call to {path}: it is not exposed{where}; decorate it with @rpc.expose "
            "or list its module in [rpc] allow"
        )

    def check_class(self, cls: type, *, worker: str) -> None:
        """Refuse to rebuild an instance of ``cls`` unless it is exposed or allowed."""
        if not (
            is_exposed(cls)
            or self.allowed_module(cls.__module__)
            or _default_module(cls.__module__)
            or self.program_object(cls)
        ):
            raise RpcRefused(
                f"{worker} refused an instance of {cls.__module__}.{cls.__qualname__}: the class is not exposed"
            )
