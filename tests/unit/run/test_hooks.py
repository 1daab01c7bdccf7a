"""The hook points load rocm-yolo's testing plugin on request, and nothing else unless a test asks (issue 45)."""

from __future__ import annotations

from rocm_yolo import environment
from rocm_yolo.run import hooks


def test_a_plugin_variable_naming_any_other_module_imports_nothing_unless_a_test_switch_is_set(tmp_path, monkeypatch):
    """``ROCM_YOLO_PLUGINS`` names a module; in production only ``rocm_yolo.testing`` is taken: a variable set by
    someone else (an inherited environment, a spec) cannot import a module of theirs into the trainer."""
    marker = tmp_path / "ran"
    (tmp_path / "strangers_plugin.py").write_text(
        f"open({str(marker)!r}, 'a').write('ran')\ndef trainer_callbacks(paths, attempt):\n    return ['theirs']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(environment.ANY_PLUGIN, raising=False)
    monkeypatch.setenv(environment.PLUGINS, "strangers_plugin")
    assert hooks.trainer_callbacks(None, 1) == [] and not marker.exists()
    monkeypatch.setenv(environment.PLUGINS, "rocm_yolo.testing")  # rocm-yolo's own: taken (no fault asked: none)
    assert hooks.trainer_callbacks(None, 1) == []
    monkeypatch.setenv(environment.ANY_PLUGIN, "1")  # a test's own plugin (tests/e2e/midsave_stop.py)
    monkeypatch.setenv(environment.PLUGINS, "strangers_plugin")
    assert hooks.trainer_callbacks(None, 1) == ["theirs"] and marker.exists()
