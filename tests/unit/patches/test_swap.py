"""The shape every patch shares: a replacement made from the original, once, and the original put back exactly."""

from __future__ import annotations

import types

from rocm_yolo.patches.swap import MARK, Swaps


def wrapping(original):
    def replacement(*args):
        return ("wrapped", original(*args) if original else None)

    return replacement


def test_replace_once_and_restore_exactly():
    class Owner:
        def f(self):
            return 1

    original = Owner.__dict__["f"]
    swaps = Swaps()
    assert not swaps.installed()
    assert swaps.replace(Owner, "f", wrapping) and swaps.installed()
    patched = Owner.__dict__["f"]
    assert getattr(patched, MARK) and Owner().f() == ("wrapped", 1)
    assert not swaps.replace(Owner, "f", wrapping) and Owner.__dict__["f"] is patched  # idempotent
    assert not Swaps().replace(Owner, "f", wrapping) and Owner.__dict__["f"] is patched  # another's: not twice
    swaps.restore()
    assert Owner.__dict__["f"] is original and not swaps.installed()
    swaps.restore()  # a no-op


def test_an_attribute_the_owner_did_not_have_is_removed_again():
    module = types.ModuleType("m")
    swaps = Swaps()
    swaps.replace(module, "enumerate", lambda original: lambda x: original)  # the builtin: not the module's own
    assert module.enumerate(0) is None
    swaps.restore()
    assert "enumerate" not in vars(module)


def test_several_attributes_and_one_replaced_since_by_someone_else():
    module = types.ModuleType("m")
    module.a, module.b = (lambda: "a"), (lambda: "b")
    original_a = module.a
    swaps = Swaps()
    for name in ("a", "b"):
        swaps.replace(module, name, wrapping)
    assert (module.a(), module.b()) == (("wrapped", "a"), ("wrapped", "b"))

    def theirs():
        return "theirs"

    module.b = theirs
    swaps.restore()
    assert module.a is original_a and module.b is theirs and not swaps.installed()
