"""`make demo` and `make test` from a fresh clone: the torch they choose for each GPU, what a second run does,
how a failed step reads, and that CI and the README use the same commands.

The Makefile runs in a copy of the project (no .venv), so nothing here touches the checkout's own set-up.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import kfd_tree
from rocm_yolo.doctor import FAIL, OK, Options
from rocm_yolo.doctor import system as doctor_system
from rocm_yolo.gpu import arch, wheels

ROOT = Path(__file__).resolve().parents[2]
AMD = wheels.AMD_INDEX
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")

# gfx_target_version -> the pip arguments for torch (a fake KFD tree with that GPU; None: no GPU at all)
CASES = {
    "gfx1010": (100100, f"'torch[device-gfx1010]' 'torchvision[device-gfx1010]' --index-url {AMD}"),
    "gfx1030": (100300, f"'torch[device-gfx1030]' 'torchvision[device-gfx1030]' --index-url {AMD}"),
    "gfx1100": (110000, f"'torch[device-gfx1100]' 'torchvision[device-gfx1100]' --index-url {AMD}"),
    "gfx90a": (90010, f"'torch[device-gfx90a]' 'torchvision[device-gfx90a]' --index-url {AMD}"),
    "no GPU": (None, "torch torchvision"),
}


@pytest.fixture
def clone(tmp_path) -> Path:
    """The files `make` reads, copied as a fresh clone has them (no .venv)."""
    dest = tmp_path / "clone"
    dest.mkdir()
    for name in ("Makefile", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "rocm_yolo", dest / "rocm_yolo", symlinks=True, ignore=ignore)
    shutil.copytree(ROOT / "patches", dest / "patches", ignore=ignore)
    return dest


def make(clone: Path, *args: str, kfd: Path | None = None, python: str = sys.executable, **env: str):
    # as from a shell: not as a sub-make of `make test` (CI), which would print "make[1]: Entering directory"
    environ = {
        k: v for k, v in os.environ.items() if k not in ("TORCH_SPEC", "TORCH_INDEX") and not k.startswith("MAKE")
    }
    environ.pop("MFLAGS", None)
    environ.update(env, ROCM_YOLO_KFD_ROOT=str(kfd or clone / "no-kfd"))
    return subprocess.run(
        ["make", f"PYTHON={python}", *args],
        cwd=clone,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("card", CASES)
def test_each_card_gets_its_torch_in_the_makefile_and_the_doctor(card, clone, tmp_path):
    version, pip_args = CASES[card]
    nodes = kfd_tree(tmp_path / "kfd", version)
    gpus = arch.detect_gpus(nodes)
    assert wheels.for_this_machine(env={}, root=nodes).pip_args() == [
        a.strip("'") for a in re.findall(r"'[^']*'|\S+", pip_args)
    ]
    dry = make(clone, "-n", "demo", kfd=nodes)
    assert dry.returncode == 0, dry.stderr
    assert f"-m pip install --quiet {pip_args} )" in dry.stdout
    assert f"make: torch for this machine: {wheels.for_this_machine(env={}, root=nodes).why}" in dry.stdout
    assert "make: creating .venv" in dry.stdout and "pip install --quiet -c .venv/constraints.txt ." in dry.stdout
    row = {r.check: r for r in doctor_system.check_versions(Options(root=tmp_path), gpus)}["versions.torch"]
    if doctor_system.torch_kind(doctor_system.torch_build()) == "hip":
        pytest.skip("this torch is a ROCm build: the doctor's row depends on its code, not on the card")
    if version is None:
        assert row.status == OK and row.fix is None
    else:
        assert row.status == FAIL and f"pip install {pip_args}" in row.fix, row.fix


def test_a_card_without_amd_wheels_is_told_what_remains(clone, tmp_path):
    nodes = kfd_tree(tmp_path / "kfd", 90012)  # gfx90c, a Renoir/Cezanne APU: no wheels, no known override
    choice = wheels.for_this_machine(env={}, root=nodes)
    assert choice.pip_args() == ["torch", "torchvision"] and choice.index is None
    assert choice.advice().startswith("AMD publishes no torch wheels for gfx90c: use a distribution's ROCm build")
    dry = make(clone, "-n", "demo", kfd=nodes)
    assert "-m pip install --quiet torch torchvision )" in dry.stdout
    assert "make: torch for this machine: AMD publishes no torch wheels for gfx90c" in dry.stdout
    known = wheels.override_note("gfx1013")  # a gfx101x without wheels: the family's known value and its source
    assert "AMD's gfx1010 wheels with HSA_OVERRIDE_GFX_VERSION=10.1.0" in known and "legacy-rocm-build#887" in known


def test_two_cards_get_both_architectures_and_torch_spec_overrides(clone, tmp_path):
    nodes = kfd_tree(tmp_path / "kfd", 100100, 110000)
    both = f"'torch[device-gfx1010,device-gfx1100]' 'torchvision[device-gfx1010,device-gfx1100]' --index-url {AMD}"
    assert both in make(clone, "-n", "demo", kfd=nodes).stdout
    mine = make(clone, "-n", "demo", kfd=nodes, TORCH_SPEC="torch==2.5.1", TORCH_INDEX="https://example.org/simple")
    assert "-m pip install --quiet torch==2.5.1 --index-url https://example.org/simple )" in mine.stdout


def test_make_help_lists_the_targets_and_the_torch_choice(clone, tmp_path):
    out = make(clone, "help", kfd=kfd_tree(tmp_path / "kfd", 100100))
    assert out.returncode == 0, out.stderr
    for target in ("make demo", "make test", "make test-all", "make check", "make torch", "make help"):
        assert target in out.stdout
    assert "'torch[device-gfx1010]'" in out.stdout


def test_a_second_make_demo_installs_nothing(clone):
    """With .venv set up (stamps newer than the sources), `make demo` only trains and `make test` only tests."""
    venv = clone / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").symlink_to(sys.executable)
    later = time.time() + 5
    for i, stamp in enumerate((".torch", ".project", ".project-test")):
        (venv / stamp).touch()
        os.utime(venv / stamp, (later + i, later + i))
    assert make(clone, "-n", "demo").stdout.splitlines() == [".venv/bin/rocm-yolo train demo --epochs 2 --device cpu"]
    assert make(clone, "-n", "test").stdout.splitlines() == [".venv/bin/python -m pytest -q -m quick"]
    assert make(clone, "-n", "test-all").stdout.splitlines() == [".venv/bin/python -m pytest -q"]
    source = clone / "rocm_yolo/cli.py"  # a changed source is installed again, torch is not
    os.utime(source, (later + 10, later + 10))
    again = make(clone, "-n", "demo").stdout
    assert "installing rocm-yolo" in again and "installing torch" not in again and "creating .venv" not in again
    assert '-c "$HOLD_TORCH" > .venv/constraints.txt' in again  # the torch there now is held, not the first one


def test_a_failed_step_says_which_and_why_in_one_line(clone):
    """One line: the step, pip's first error line (whatever pip says on this machine: its wording depends on the
    indexes and links its configuration names), and where all of it is."""
    out = make(clone, "torch", TORCH_SPEC="torch==0.0.1", TORCH_INDEX=(clone / "no-index").as_uri())
    assert out.returncode != 0
    lines = out.stdout.splitlines()
    assert [line for line in lines if " failed: " in line] == lines[-1:], out.stdout
    assert lines[-1].startswith("make: installing torch: pip install torch==0.0.1 --index-url file://")
    log = (clone / ".venv/make.log").read_text().splitlines()
    first_error = next(line for line in log if re.match(r"^(ERROR|[A-Za-z]*Error)", line))
    assert f" failed: {first_error} (all of it: .venv/make.log)" in lines[-1], out.stdout
    assert not (clone / ".venv/.torch").exists()  # the next `make` tries again
    for clean in (False, True):  # .venv is there, torch is not; then no .venv at all
        if clean:
            shutil.rmtree(clone / ".venv")
        missing = make(clone, "demo", python="/nonexistent/python3")
        assert missing.returncode != 0 and "make: choosing torch failed: " in missing.stdout
        assert "(is Python 3.11+ installed as /nonexistent/python3?)" in missing.stdout
    pyenv = sorted(Path("~/.pyenv/versions").expanduser().glob("3.1[0-9].*/bin/python3"))  # where pyenv keeps some
    older = next(filter(None, map(older_python, ("python3.10", "python3.9", *map(str, pyenv)))), None)
    if older:  # pyproject's requires-python, said before a venv or torch is made
        shutil.rmtree(clone / ".venv", ignore_errors=True)
        out = make(clone, "demo", python=older)
        assert out.returncode != 0 and "make: rocm-yolo needs Python 3.11 or newer" in out.stdout.splitlines()[-1]
        assert not (clone / ".venv").exists()


def older_python(name: str) -> str | None:
    """A Python older than 3.11 on this machine that really runs (pyenv's shims of unselected versions do not)."""
    found = shutil.which(name) if "/" not in name else name
    try:
        ran = found and subprocess.run([found, "-c", "import sys; print(sys.version_info < (3, 11))"],
                                       capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return found if ran and ran.stdout.strip() == "True" else None


def test_a_bad_choice_of_torch_is_one_line_that_names_it(clone):
    """make help and make torch with a TORCH_SPEC that is no requirement (a quote in it), or with no Python: one
    line naming what is wrong, never 'pip install ;', never a shell syntax error, and a non-zero exit."""
    for target in ("help", "torch"):
        out = make(clone, target, TORCH_SPEC="torch'x")
        assert out.returncode != 0 and "pip install ;" not in out.stdout, out.stdout
        [line] = [x for x in out.stdout.splitlines() if "failed" in x]
        assert line.startswith("make: choosing torch failed: TORCH_SPEC=") and "is not a pip requirement" in line
        assert "syntax error" not in out.stdout + out.stderr and "is Python" not in line
    out = make(clone, "help", python="/nonexistent/python3")
    assert out.returncode != 0 and "pip install ;" not in out.stdout
    assert "make: choosing torch failed: " in out.stdout and "/nonexistent/python3?" in out.stdout


def test_ci_runs_make_test_all_and_the_readme_shows_what_make_runs():
    ci = (ROOT / ".ci/run").read_text()
    assert re.search(r"^make test-all$", ci, re.M)
    readme = (ROOT / "README.md").read_text()
    first_screen = "\n".join(readme.splitlines()[:40])
    assert "make demo" in first_screen and "make test" in first_screen and "make test-all" in first_screen
    recipes = (ROOT / "Makefile").read_text()
    demo = re.search(r"^demo:.*\n\t\$\(VENV\)/bin/(.+)$", recipes, re.M)[1]
    assert demo in readme
    for target in ("test", "test-all"):
        command = re.search(rf"^{target}:.*\n\t\$\(PY\) (.+)$", recipes, re.M)[1]
        assert f"python {command}" in readme, target
