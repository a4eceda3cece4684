"""Compact pickling for the frozen value classes that cross process boundaries (scenarios, jobs).

A frozen slots dataclass pickles through the state functions that ``dataclass`` adds: each object calls
``dataclasses.fields`` on the way out and again on the way in, and sets its fields one by one through
``object.__setattr__``. A market with worker processes sends every generated scenario to its parent and back, so
that cost is paid four times per negotiation. :func:`compact_pickling` pickles such an object as its class and the
tuple of its field values (read by one C-level getter) and restores it by filling the slots directly: the same
object, without running ``__init__`` or ``__post_init__`` again (it was checked when it was first made).
"""

from __future__ import annotations

import copyreg
import operator
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")

_SETTERS: dict[type, tuple[Callable[[Any, Any], None], ...]] = {}


def compact_pickling(cls: type[T]) -> type[T]:
    """Give the frozen slots dataclass ``cls`` a ``__reduce__`` that pickles its field values as one tuple."""
    names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    if "__slots__" not in cls.__dict__ or not names:
        raise TypeError(f"{cls.__name__}: compact pickling needs a slots dataclass with fields")
    _SETTERS[cls] = tuple(cls.__dict__[name].__set__ for name in names)
    read = operator.attrgetter(*names)
    values: Callable[[Any], tuple[Any, ...]] = read if len(names) > 1 else (lambda self: (read(self),))

    def __reduce__(self: T) -> tuple[Any, ...]:
        if type(self) is not cls:  # a subclass (perhaps with fields of its own) pickles as dataclasses pickle it
            return copyreg.__newobj__, (type(self),), self.__getstate__()  # type: ignore[attr-defined]
        return _restore, (cls, values(self))

    cls.__reduce__ = __reduce__  # type: ignore[assignment, method-assign]
    return cls


def _restore(cls: type[T], values: tuple[Any, ...]) -> T:
    obj = object.__new__(cls)
    for setter, value in zip(_SETTERS[cls], values, strict=True):
        setter(obj, value)
    return obj
