"""Every install line in the README and the docs names this project so that
pip installs it: the distribution `jax-collectives`, its extras, a checkout
or a wheel built from it.

The wheel is built once from this checkout; each documented `pip install`
line that names the project by name runs as written against it (resolution
only: `--dry-run`, no index, no dependencies), and every extra a line asks
for must be one the wheel provides. CI installs the wheel for real, with its
dependencies, in a fresh venv (.ci/run).
"""

import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser

import pytest

from helpers import ROOT

DIST = "jax-collectives"
DOCUMENTS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md",
             *sorted((ROOT / "docs").glob("*.md"))]
INSTALL = re.compile(r"pip install ([^`\n]+)")


def documented_lines():
    """(file, the arguments after `pip install`) for every documented line."""
    found = []
    for path in DOCUMENTS:
        text = re.sub(r"\\\n\s*", " ", path.read_text())  # continuation lines
        for match in INSTALL.finditer(text):
            args = match.group(1).split("#")[0].split("&&")[0].strip()
            found.append((path.relative_to(ROOT).as_posix(), args))
    return found


def ours(args):
    """The requirement of this project in a line's arguments, or None."""
    for word in shlex.split(args):
        name = re.split(r"[\[<>=!~ ]", word, maxsplit=1)[0]
        if word.startswith(".") or name in (DIST, DIST.replace("-", "_")):
            return word
    return None


def extras(requirement):
    match = re.search(r"\[([^\]]*)\]", requirement)
    return {e.strip() for e in match.group(1).split(",")} if match else set()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    # Built from a copy of the tree: setuptools writes build/ and *.egg-info
    # beside the sources, so two test processes building the checkout at
    # once would race there.
    source = tmp_path_factory.mktemp("source") / "tree"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "_build", "__pycache__", ".tox"))
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "-w", str(out), str(source)],
                   check=True, capture_output=True, timeout=300)
    (built,) = out.glob("jax_collectives-*.whl")
    return built


def metadata(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(archive.read(name).decode())


def test_the_wheel_is_jax_collectives_with_its_extras_recipe_and_guide_files(wheel):
    meta = metadata(wheel)
    assert meta["Name"] == DIST
    assert set(meta.get_all("Provides-Extra")) >= {"train", "test", "bench", "docs",
                                                    "lint"}
    requires = " ".join(meta.get_all("Requires-Dist"))
    assert re.search(r"\bjax>=0\.8", requires) and "numpy" in requires
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for folder in ("recipes", "guides"):
        for path in sorted((ROOT / folder).glob("*.py")):
            assert f"collectives/{folder}/{path.name}" in names, path.name
    # the data files the package reads at run time
    for data in ("collectives/bench/schema.json", "collectives/plan/profiles.toml"):
        assert data in names, data


def test_no_line_installs_the_unrelated_collectives_project():
    for where, args in documented_lines():
        for word in shlex.split(args):
            assert not re.fullmatch(r"collectives(\[.*\])?", word), (
                f"{where}: `pip install {args}` installs the unrelated `collectives` "
                f"project on the package index. Fix: `{DIST}`, or `.` in a checkout.")


def test_no_message_of_the_package_names_the_unrelated_project():
    # error messages and docstrings that tell users what to install
    for path in sorted([*(ROOT / "collectives").rglob("*.py"),
                        *(ROOT / "recipes").glob("*.py"),
                        *(ROOT / "guides").glob("*.py")]):
        if path.is_symlink() or path.relative_to(ROOT).parts[1:2] in (
                ("recipes",), ("guides",)):
            continue  # collectives/recipes is recipes/, read once (guides too)
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not re.search(r"(?<![\w-])collectives\[", line), (
                f"{path.relative_to(ROOT)}:{number}: `collectives[...]` is the "
                f"unrelated project on the package index. Fix: name `{DIST}` or "
                "the plain dependency.")


def test_every_line_that_names_the_project_installs_it(wheel, tmp_path):
    provided = set(metadata(wheel).get_all("Provides-Extra"))
    named = [(where, args) for where, args in documented_lines() if ours(args)]
    assert any(ours(args).startswith(DIST) for _, args in named), (
        "no documented line installs the project by its name")
    dist = tmp_path / "dist"
    dist.mkdir()
    shutil.copy(wheel, dist)
    for where, args in named:
        requirement = ours(args)
        missing = extras(requirement) - provided
        assert not missing, f"{where}: `pip install {args}`: no extra {missing}"
        if requirement.startswith("."):
            continue  # a checkout: the wheel above is what it builds
        assert "--find-links dist" in args, (
            f"{where}: `pip install {args}`: {DIST} is not on the package index "
            "yet; the line must say where the wheel is (--find-links dist)")
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", *shlex.split(args), "--dry-run",
             "--no-index", "--no-deps", "--ignore-installed", "-q", "--report", "-"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"{where}: pip install {args}\n{result.stderr}"
        assert f'"name": "{DIST}"' in result.stdout, result.stdout[:2000]
