"""The shape every patch shares: attributes of a class or a module replaced by wrappers, and put back exactly.

A patch makes its replacement from what it replaces, and :meth:`Swaps.replace` sets it, marked
``__rocm_yolo_patch__`` (:data:`MARK`): installing again replaces nothing, neither through the same
:class:`Swaps` nor over another's replacement. :meth:`Swaps.restore` puts every original object back (an
attribute the owner did not have is removed again) where a patch's replacement is still in place, and
:meth:`Swaps.installed` says whether the patch is installed. Each patch keeps one :class:`Swaps` and adds
its own state (settings, a run directory) around it.
"""

from __future__ import annotations

from typing import Any, Callable

MARK = "__rocm_yolo_patch__"
_ABSENT = object()  # the owner had no attribute of that name of its own


class Swaps:
    """The attributes one patch replaced, each with the object it replaced."""

    def __init__(self) -> None:
        self._swapped: list[tuple[Any, str, Any]] = []  # (owner, name, original or _ABSENT), in the order made

    def installed(self) -> bool:
        return bool(self._swapped)

    def replace(self, owner: Any, name: str, make: Callable[[Any], Any]) -> bool:
        """Set ``owner.name`` to ``make(original)``, the original read from ``owner``'s own ``__dict__`` (None when
        it has none). Nothing is replaced, and False returned, when this patch replaced it already or the
        attribute is a patch's replacement."""
        if any(o is owner and n == name for o, n, _ in self._swapped):
            return False
        original = vars(owner).get(name, _ABSENT)
        if getattr(original, MARK, False):
            return False
        replacement = make(None if original is _ABSENT else original)
        setattr(replacement, MARK, True)
        setattr(owner, name, replacement)
        self._swapped.append((owner, name, original))
        return True

    def restore(self) -> None:
        """Put every original back, the last replaced first, where a patch's replacement is still in place; the
        patch is then not installed. A no-op when it is not installed."""
        while self._swapped:
            owner, name, original = self._swapped.pop()
            if not getattr(vars(owner).get(name), MARK, False):
                continue  # someone else's since: left as it is
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
