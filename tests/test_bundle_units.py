"""Unit tests of `localinfer bundle`'s parts: targets, wheel closure, file check, prompts,
launchers and janitor. Fast and offline: synthetic wheels and hand-made bundle folders only."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from localinfer.bundle import check, demo, launchers, wheelhouse
from localinfer.bundle.manifest import FORMAT, Manifest
from localinfer.bundle.targets import PLATFORMS, Target, host_platform, parse_targets
from localinfer.errors import BundleError

HOST_PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX shell / signals")


# ---------------------------------------------------------------------------------------------
# targets


def test_parse_targets_host_is_this_machine() -> None:
    """`--platform host` (and no --python) must mean this machine's platform and Python."""
    assert parse_targets(["host"], []) == [Target(host_platform(), HOST_PY)]
    assert parse_targets([], []) == [Target(host_platform(), HOST_PY)]


def test_parse_targets_comma_separated_and_repeated() -> None:
    """Comma lists and repeated options multiply out, in order, without duplicates."""
    got = parse_targets(["linux-x86_64,windows-amd64", "macos-arm64", "linux-x86_64"],
                        ["3.10, 3.11", "3.12", "3.10"])
    want = [Target(p, py) for p in ("linux-x86_64", "windows-amd64", "macos-arm64")
            for py in ("3.10", "3.11", "3.12")]
    assert got == want


@pytest.mark.parametrize("platforms, pythons", [
    (["solaris-sparc"], ["3.11"]),
    (["linux-x86_64,bogus"], ["3.11"]),
    (["linux-x86_64"], ["3.9"]),
    (["linux-x86_64"], ["3"]),
    (["linux-x86_64"], ["3.11.4"]),
    (["linux-x86_64"], ["py311"]),
    (["linux-x86_64"], ["3.11,2.7"]),
])
def test_parse_targets_refuses_bad_values(platforms: list[str], pythons: list[str]) -> None:
    """An unknown platform or a --python that is not 3.10+ 'X.Y' is a BundleError, not a
    wheelhouse pip cannot fill."""
    with pytest.raises(BundleError):
        parse_targets(platforms, pythons)


def _option_values(args: list[str], option: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == option]


def test_pip_args_select_only_the_targets_wheels() -> None:
    """pip download must be told the target's platform, Python and ABIs, binary wheels only,
    or it fetches this machine's wheels (or sdists that need a compiler on the target)."""
    args = Target("windows-amd64", "3.10").pip_args()
    assert "--only-binary=:all:" in args
    assert _option_values(args, "--platform") == ["win_amd64"]
    assert _option_values(args, "--python-version") == ["3.10"]
    assert _option_values(args, "--implementation") == ["cp"]
    assert set(_option_values(args, "--abi")) == {"cp310", "abi3", "none"}


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_linux_targets_list_every_manylinux_baseline(arch: str) -> None:
    """pip does not expand manylinux_2_X tags: the list must run from manylinux2014 to 2_28,
    or numpy/numba wheels tagged with another baseline are not found."""
    plats = _option_values(Target(f"linux-{arch}", "3.11").pip_args(), "--platform")
    assert f"manylinux2014_{arch}" in plats
    assert f"manylinux_2_17_{arch}" in plats
    assert f"manylinux_2_28_{arch}" in plats
    assert all(p.endswith(arch) for p in plats)


@pytest.mark.parametrize("platform_, want", [
    ("windows-amd64", {"sys_platform": "win32", "platform_system": "Windows",
                       "platform_machine": "AMD64", "os_name": "nt"}),
    ("macos-arm64", {"sys_platform": "darwin", "platform_system": "Darwin",
                     "platform_machine": "arm64", "os_name": "posix"}),
    ("linux-x86_64", {"sys_platform": "linux", "platform_system": "Linux",
                      "platform_machine": "x86_64", "os_name": "posix"}),
    ("linux-aarch64", {"sys_platform": "linux", "platform_system": "Linux",
                       "platform_machine": "aarch64", "os_name": "posix"}),
])
def test_marker_env_is_the_targets(platform_: str, want: dict[str, str]) -> None:
    """PEP 508 markers must be evaluated with the target's values, not this machine's."""
    env = Target(platform_, "3.12").marker_env()
    for key, value in want.items():
        assert env[key] == value, key
    assert env["python_version"] == "3.12"
    assert env["python_full_version"].startswith("3.12.")
    assert env["implementation_name"] == "cpython"


def test_target_names_are_distinct_folder_names() -> None:
    assert Target("linux-x86_64", "3.11").name == "linux-x86_64-cp311"
    names = {Target(p, py).name for p in PLATFORMS for py in ("3.10", "3.11", "3.12")}
    assert len(names) == len(PLATFORMS) * 3


def test_launcher_target_name_matches_the_wheelhouse_name() -> None:
    """check.target_name() is what run.sh/run.ps1 compute with the target's python; it must
    equal the wheelhouse folder create writes (Target.name), or no launcher finds its wheels."""
    assert check.target_name() == Target(host_platform(), HOST_PY).name


# ---------------------------------------------------------------------------------------------
# wheelhouse: closure, wheel checks, lock

ROOT_REQUIRES = [
    'colorama; platform_system == "Windows"',
    'tomli; python_version < "3.11"',
    "numpy>=1.26",
    'fastapi; extra == "server"',
]


def _wheel(folder: Path, name: str, version: str, requires: Sequence[str] = (), *,
           extras: Sequence[str] = (), license_expr: str | None = None,
           classifiers: Sequence[str] = (), license_text: str | None = None,
           members: dict[str, bytes] | None = None) -> Path:
    """A minimal wheel: NAME-VER.dist-info/METADATA (+ RECORD) and any extra members."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}"
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if license_expr:
        lines.append(f"License-Expression: {license_expr}")
    if license_text:
        lines.append(f"License: {license_text}")
    lines += [f"Classifier: {c}" for c in classifiers]
    lines += [f"Provides-Extra: {e}" for e in extras]
    lines += [f"Requires-Dist: {r}" for r in requires]
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{dist}.dist-info/METADATA", "\n".join(lines) + "\n\n")
        zf.writestr(f"{dist}.dist-info/RECORD", "")
        zf.writestr(f"{name.replace('-', '_')}/__init__.py", "")
        for member, data in (members or {}).items():
            zf.writestr(member, data)
    return path


def _house(folder: Path, numpy_version: str = "1.26.4", *, unused: bool = False) -> Path:
    _wheel(folder, "localinfer", "0.1.0", ROOT_REQUIRES, extras=["server"])
    _wheel(folder, "numpy", numpy_version, license_expr="BSD-3-Clause")
    _wheel(folder, "fastapi", "0.110.0", ['starlette>=0.36; python_version >= "3.8"'])
    _wheel(folder, "starlette", "0.37.0", ['colorama; sys_platform == "win32"'])  # asked twice
    if unused:
        _wheel(folder, "rich", "13.0.0")
    return folder


def _wheels(folder: Path) -> dict[str, wheelhouse.Wheel]:
    return {w.name: w for w in map(wheelhouse.read_wheel, sorted(folder.glob("*.whl")))}


def _closure(target: Target, folder: Path, root: str = "localinfer[server]"):
    closure, missing = wheelhouse._closure(target, _wheels(folder), Requirement(root))
    return set(closure), [r.name for r in missing]


def test_closure_uses_the_targets_markers_windows(tmp_path: Path) -> None:
    """From Linux, pip skips Windows-only colorama; the closure must report it missing for a
    Windows target (and not tomli, which a 3.11 target never installs)."""
    names, missing = _closure(Target("windows-amd64", "3.11"), _house(tmp_path))
    assert names == {"localinfer", "numpy", "fastapi", "starlette"}
    assert missing == ["colorama"]  # once, though two wheels ask for it


def test_closure_uses_the_targets_markers_python310(tmp_path: Path) -> None:
    """A 3.10 Linux target needs tomli (python_version < 3.11) and never colorama."""
    names, missing = _closure(Target("linux-x86_64", "3.10"), _house(tmp_path))
    assert names == {"localinfer", "numpy", "fastapi", "starlette"}
    assert missing == ["tomli"]


def test_closure_follows_extras_only_when_asked(tmp_path: Path) -> None:
    """`extra == "server"` deps belong to localinfer[server] only."""
    names, missing = _closure(Target("linux-x86_64", "3.12"), _house(tmp_path), "localinfer")
    assert names == {"localinfer", "numpy"}
    assert missing == []


def test_closure_leaves_out_wheels_nobody_requires(tmp_path: Path) -> None:
    """A wheel pip fetched for this machine's markers but the target never installs must not be
    in the closure (fill deletes what is outside it)."""
    names, _ = _closure(Target("linux-x86_64", "3.12"), _house(tmp_path, unused=True))
    assert "rich" not in names


def test_closure_refuses_a_version_conflict(tmp_path: Path) -> None:
    """numpy 1.0 present for numpy>=1.26: the lock would not install; BundleError now."""
    with pytest.raises(BundleError, match="numpy"):
        _closure(Target("linux-x86_64", "3.12"), _house(tmp_path, numpy_version="1.0"))


def test_missing_requirements_are_downloaded_without_their_marker() -> None:
    """pip evaluates markers on this machine: a missing dep must be asked for marker-free, or
    pip skips colorama again from Linux and the closure never converges."""
    req = wheelhouse._without_marker(Requirement('colorama>=0.4; platform_system == "Windows"'))
    assert str(req) == "colorama>=0.4"


def test_fill_adds_what_pip_skipped_and_drops_what_the_target_does_not_need(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fill with pip faked: the first download resolves for *this* machine (no colorama, but a
    host-only wheel); fill must then fetch colorama --no-deps, delete the host-only wheel and
    hash every wheel it keeps."""
    dest = tmp_path / "house"
    own = _wheel(dest, "localinfer", "0.1.0", ROOT_REQUIRES + ['hostonly; sys_platform == "linux"'],
                 extras=["server"])
    calls: list[list[str]] = []

    def fake_pip(args: list[str], progress: bool, what: str) -> None:
        calls.append(args)
        out = Path(args[args.index("-d") + 1])
        if "--no-deps" in args:
            for spec in args[args.index("-d") + 2:]:
                _wheel(out, Requirement(spec).name, "0.4.6")
        else:
            _wheel(out, "numpy", "1.26.4")
            _wheel(out, "fastapi", "0.110.0")
            _wheel(out, "hostonly", "1.0")

    monkeypatch.setattr(wheelhouse, "_pip", fake_pip)
    wheels = wheelhouse.fill(Target("windows-amd64", "3.12"), own, ["server"], dest, progress=False)
    assert [w.name for w in wheels] == ["colorama", "fastapi", "localinfer", "numpy"]
    assert len(calls) == 2 and calls[1][-1] == "colorama"
    assert _option_values(calls[1], "--platform") == ["win_amd64"]
    assert sorted(p.name.split("-")[0] for p in dest.glob("*.whl")) == \
        ["colorama", "fastapi", "localinfer", "numpy"]
    for w in wheels:
        assert w.sha256 == hashlib.sha256(w.path.read_bytes()).hexdigest()


@pytest.mark.parametrize("member", ["evil.pth", "x-1.0.data/purelib/evil.pth",
                                    "x-1.0.data/platlib/evil.pth"])
def test_read_wheel_refuses_pth_files(tmp_path: Path, member: str) -> None:
    """A .pth at site-packages' top level runs code at every interpreter start: refused."""
    path = _wheel(tmp_path, "x", "1.0", members={member: b"import os\n"})
    with pytest.raises(BundleError, match=r"\.pth"):
        wheelhouse.read_wheel(path)


def test_read_wheel_allows_listed_and_nested_pth(tmp_path: Path) -> None:
    """setuptools' distutils-precedence.pth is allow-listed; a .pth inside a package is inert."""
    path = _wheel(tmp_path, "x", "1.0", members={"distutils-precedence.pth": b"",
                                                 "x/data/inert.pth": b""})
    assert wheelhouse.read_wheel(path).name == "x"


@pytest.mark.parametrize("member", ["x/__pycache__/k.f-12.py311.nbi",
                                    "x/__pycache__/k.f-12.py311.1.nbc"])
def test_read_wheel_refuses_numba_caches(tmp_path: Path, member: str) -> None:
    """Numba caches are pickles of CPU-specific code: never shipped."""
    path = _wheel(tmp_path, "x", "1.0", members={member: b"\x80\x04"})
    with pytest.raises(BundleError, match="Numba"):
        wheelhouse.read_wheel(path)


def test_read_wheel_refuses_non_wheels(tmp_path: Path) -> None:
    bad = tmp_path / "x-1.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(BundleError, match="zip"):
        wheelhouse.read_wheel(bad)
    empty = tmp_path / "y-1.0-py3-none-any.whl"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("y/__init__.py", "")
    with pytest.raises(BundleError, match="METADATA"):
        wheelhouse.read_wheel(empty)


def test_read_wheel_metadata_and_licence(tmp_path: Path) -> None:
    """Name is canonicalised; the licence comes from License-Expression, else a classifier."""
    w = wheelhouse.read_wheel(_wheel(tmp_path / "a", "My_Pkg", "2.0", ["numpy>=1"],
                                     license_expr="MIT OR Apache-2.0",
                                     classifiers=["License :: OSI Approved :: BSD License"]))
    assert (w.name, w.version, w.license) == ("my-pkg", "2.0", "MIT OR Apache-2.0")
    assert [str(r) for r in w.requires] == ["numpy>=1"]
    w = wheelhouse.read_wheel(_wheel(tmp_path / "b", "p", "1", classifiers=[
        "Programming Language :: Python", "License :: OSI Approved :: BSD License"]))
    assert w.license == "BSD License"
    assert wheelhouse.read_wheel(_wheel(tmp_path / "c", "q", "1")).license == "unknown"


def test_write_lock_pins_every_wheel_by_hash(tmp_path: Path) -> None:
    """The lock is what `pip install --require-hashes` reads on the target."""
    house = _house(tmp_path / "house")
    target = Target("linux-x86_64", "3.12")
    wheels = sorted(_wheels(house).values(), key=lambda w: w.name)
    for w in wheels:
        w.sha256 = hashlib.sha256(w.path.read_bytes()).hexdigest()
    lock = tmp_path / "requirements.lock"
    wheelhouse.write_lock(target, wheels, ["tui", "server"], lock)
    lines = [ln for ln in lock.read_text().splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == len(wheels)
    for w, line in zip(wheels, lines, strict=True):
        name = "localinfer[server,tui]" if w.name == "localinfer" else w.name
        assert line == f"{name}=={w.version} --hash=sha256:{w.sha256}"
    assert re.fullmatch(r"[a-z0-9.\-\[\],]+==\S+ --hash=sha256:[0-9a-f]{64}", lines[0])
    wheelhouse.write_lock(target, wheels, [], lock)
    assert "localinfer==0.1.0 --hash" in lock.read_text()


# ---------------------------------------------------------------------------------------------
# check.py and the manifest


def _bundle(root: Path) -> Path:
    files = {
        "models/m.gguf": b"GGUF" + bytes(range(256)) * 8,
        "wheels/linux-x86_64-cp311/x-1.0-py3-none-any.whl": b"PK\x03\x04fake wheel",
        "wheels/linux-x86_64-cp311/requirements.lock": b"x==1.0 --hash=sha256:00\n",
        "run.sh": b"#!/bin/sh\n",
        "README.txt": b"hello\n",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    shutil.copyfile(check.__file__, root / "check.py")
    _write_manifest(root)
    return root


def _write_manifest(root: Path, **extra) -> None:
    files = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel != check.MANIFEST:
            files[rel] = {"size": p.stat().st_size,
                          "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
    data = {"format": FORMAT, "files": files,
            "models": [{"name": "m", "file": "models/m.gguf"}], **extra}
    (root / check.MANIFEST).write_text(json.dumps(data), encoding="utf-8")


def test_check_intact_bundle(tmp_path: Path) -> None:
    seen: list[int] = []
    assert check.problems(str(_bundle(tmp_path)), seen.append) == []
    assert sum(seen) == sum(p.stat().st_size for p in tmp_path.rglob("*")
                            if p.is_file() and p.name != check.MANIFEST)


def test_check_flipped_byte(tmp_path: Path) -> None:
    """One damaged byte in a model is found by its sha256 (same size)."""
    root = _bundle(tmp_path)
    model = root / "models" / "m.gguf"
    data = bytearray(model.read_bytes())
    data[100] ^= 0x01
    model.write_bytes(bytes(data))
    found = check.problems(str(root))
    assert len(found) == 1
    assert found[0].startswith("checksum mismatch: models/m.gguf")


def test_check_missing_file(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    (root / "wheels/linux-x86_64-cp311/x-1.0-py3-none-any.whl").unlink()
    assert check.problems(str(root)) == \
        ["missing file: wheels/linux-x86_64-cp311/x-1.0-py3-none-any.whl"]


def test_check_unexpected_file(tmp_path: Path) -> None:
    """Anything not in the manifest (a planted wheel, a .pth) is reported."""
    root = _bundle(tmp_path)
    (root / "wheels/linux-x86_64-cp311/planted-1.0-py3-none-any.whl").write_bytes(b"PK")
    found = check.problems(str(root))
    assert len(found) == 1
    assert found[0].startswith("unexpected file: wheels/linux-x86_64-cp311/planted-1.0")


def test_check_wrong_size(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    with open(root / "README.txt", "ab") as f:
        f.write(b"more")
    found = check.problems(str(root))
    assert len(found) == 1 and found[0].startswith("wrong size: README.txt")


@posix_only
def test_check_reports_symlinks(tmp_path: Path) -> None:
    """A symlink could point anywhere (a file outside the bundle, a model replaced): refused,
    whether it replaces a listed file, is extra, or is a directory link."""
    root = _bundle(tmp_path / "b")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x").write_text("x")
    (root / "README.txt").unlink()
    (root / "README.txt").symlink_to(outside / "x")
    (root / "wheels" / "linked").symlink_to(outside, target_is_directory=True)
    found = check.problems(str(root))
    assert "unexpected symlink: README.txt" in found
    assert "unexpected symlink: wheels/linked" in found
    assert "missing file: README.txt" in found


def test_check_ignores_the_launchers_state(tmp_path: Path) -> None:
    """.runtime/ (venvs, home) is made by the launchers on the target: never a problem."""
    root = _bundle(tmp_path)
    (root / ".runtime" / "venv-x" / "bin").mkdir(parents=True)
    (root / ".runtime" / "venv-x" / "bin" / "python").write_text("x")
    assert check.problems(str(root)) == []
    (root / "wheels" / ".runtime").mkdir()  # only the top-level one is the launchers'
    (root / "wheels" / ".runtime" / "f").write_text("x")
    assert check.problems(str(root)) == ["unexpected file: wheels/.runtime/f (not in the manifest)"]


@pytest.mark.parametrize("name", ["../escape", "/abs", "models/../../x", "a\\b", "C:/x",
                                  "models//m", "./m", ""])
def test_manifest_with_unsafe_names_is_refused(tmp_path: Path, name: str) -> None:
    """A manifest path outside the bundle must never be opened or hashed."""
    root = _bundle(tmp_path)
    data = json.loads((root / check.MANIFEST).read_text())
    data["files"][name] = {"size": 1, "sha256": "0" * 64}
    (root / check.MANIFEST).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="unsafe file name"):
        check.load_manifest(str(root))
    found = check.problems(str(root))
    assert len(found) == 1 and "unsafe file name" in found[0]


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"files": {}}',
                                  '{"files": {"a": {"size": "1", "sha256": "00"}}}'])
def test_bad_manifest_is_one_problem(tmp_path: Path, text: str) -> None:
    root = _bundle(tmp_path)
    (root / check.MANIFEST).write_text(text)
    found = check.problems(str(root))
    assert len(found) == 1 and check.MANIFEST in found[0]


def test_missing_manifest(tmp_path: Path) -> None:
    found = check.problems(str(tmp_path))
    assert len(found) == 1 and "missing" in found[0]


def _run_check(*args: str) -> subprocess.CompletedProcess[str]:
    # the way run.sh runs the copy inside the bundle: a plain script, stdlib only
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60)


def test_check_script_exit_codes(tmp_path: Path) -> None:
    """check.py as a script: 0 when intact, 1 with `bundle check:` lines when damaged; the
    copy inside the bundle checks its own folder when given no path."""
    root = _bundle(tmp_path)
    ok = _run_check(str(Path(check.__file__)), str(root))
    assert (ok.returncode, ok.stderr) == (0, "")
    assert _run_check(str(root / "check.py")).returncode == 0
    (root / "models" / "m.gguf").write_bytes(b"GGUF damaged")
    bad = _run_check(str(Path(check.__file__)), str(root))
    assert bad.returncode == 1
    assert bad.stderr.startswith("bundle check: wrong size: models/m.gguf")
    assert _run_check(str(root / "check.py")).returncode == 1


def test_check_script_target(tmp_path: Path) -> None:
    """`check.py --target` is how the launchers pick their wheelhouse folder."""
    proc = _run_check(str(Path(check.__file__)), "--target")
    assert proc.returncode == 0
    assert proc.stdout.strip() == check.target_name() == Target(host_platform(), HOST_PY).name


def test_manifest_load(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    m = Manifest.load(root)
    assert m.default_model == "m"
    assert m.model_file(root, "m") == root / "models" / "m.gguf"
    with pytest.raises(BundleError):
        m.model_file(root, "other")


@pytest.mark.parametrize("change", [
    {"format": "localinfer-bundle/999"},
    {"format": None},
    {"models": [{"name": "m", "file": "models/not-listed.gguf"}]},
    {"models": [{"name": "m", "file": "../models/m.gguf"}]},
    {"models": []},
])
def test_manifest_load_refuses(tmp_path: Path, change: dict) -> None:
    """Another format, or a model whose file the manifest does not list (so check.py never
    hashed it), is a BundleError."""
    root = _bundle(tmp_path)
    _write_manifest(root, **change)
    with pytest.raises(BundleError):
        Manifest.load(root)


def test_manifest_load_wraps_check_errors(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="missing"):
        Manifest.load(tmp_path)


# ---------------------------------------------------------------------------------------------
# demo prompts


def test_read_prompts_default() -> None:
    assert demo.read_prompts(None) == [demo.DEFAULT_PROMPT]


def test_read_prompts_text_file(tmp_path: Path) -> None:
    p = tmp_path / "prompts.txt"
    p.write_text("# demo prompts\n\nName a colour.\n  # indented comment\n  Count to three.  \n\n")
    assert demo.read_prompts(p) == ["Name a colour.", "Count to three."]


def test_read_prompts_json_list(tmp_path: Path) -> None:
    p = tmp_path / "prompts.json"
    p.write_text(json.dumps(["one", "# not a comment in JSON", "two\nlines"]))
    assert demo.read_prompts(p) == ["one", "# not a comment in JSON", "two\nlines"]


@pytest.mark.parametrize("text", ["[not json", "", "\n# only a comment\n\n", "[]", "[1, 2]",
                                  '["a", null]'])
def test_read_prompts_refuses(tmp_path: Path, text: str) -> None:
    p = tmp_path / ("prompts.json" if text.startswith("[") else "prompts.txt")
    p.write_text(text)
    with pytest.raises(BundleError):
        demo.read_prompts(p)


def test_read_prompts_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="cannot read"):
        demo.read_prompts(tmp_path / "nope.txt")


# ---------------------------------------------------------------------------------------------
# launchers

NASTY = "Don't say \"hi\"; echo $HOME `id` $(id) \\n\n\tsecond line ' '' @BUNDLE_ID@ %PATH%"
BUNDLE_ID = "smollm2-135m-2024-01-01T000000-42"


def _placeholders(text: str) -> list[str]:
    return re.findall(r"@[A-Z_]+@", text)


def _sh_export(run_sh: str, var: str) -> str:
    """The `export VAR=...` statement of run.sh (a quoted value may span lines)."""
    m = re.search(rf"^export {var}=.*?(?=\nif \[ ! -f \"\$VENV/\.complete\" \])", run_sh,
                  re.MULTILINE | re.DOTALL)
    assert m, f"no export {var}= in run.sh"
    return m.group(0)


def _sh_eval(statement: str, var: str) -> str:
    proc = subprocess.run(["sh", "-c", f'STATE=/state; {statement}\nprintf %s "${var}"'],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@posix_only
@pytest.mark.parametrize("system", [None, "Be brief.", NASTY, "Ünïcödé ‘quotes’ 😀"])
def test_run_sh_syntax(tmp_path: Path, system: str | None) -> None:
    """run.sh must parse (sh -n) whatever the system prompt, with no placeholder left."""
    text = launchers.render("smollm2-135m", system, BUNDLE_ID)["run.sh"]
    assert _placeholders(text) == _placeholders(system or "")  # only the prompt's own
    assert BUNDLE_ID in text
    path = tmp_path / "run.sh"
    path.write_text(text, encoding="utf-8")
    proc = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


@posix_only
@pytest.mark.parametrize("system", ["Be brief.", NASTY, "Ünïcödé ‘quotes’ 😀", "x'\n'y"])
def test_run_sh_exports_the_system_prompt_verbatim(system: str) -> None:
    """The system prompt reaches localinfer exactly: no $ expansion, no command substitution,
    quotes and newlines intact (and "@BUNDLE_ID@" in it is not replaced)."""
    text = launchers.render("smollm2-135m", system, BUNDLE_ID)["run.sh"]
    statement = _sh_export(text, "LOCALINFER_SYSTEM")
    assert _sh_eval(statement, "LOCALINFER_SYSTEM") == system


@posix_only
def test_run_sh_exports_the_default_model() -> None:
    text = launchers.render("qwen2.5-coder-0.5b", None, BUNDLE_ID)["run.sh"]
    line = next(ln for ln in text.splitlines() if "LOCALINFER_MODEL=" in ln)
    assert line.startswith("export ")
    assert _sh_eval(line, "LOCALINFER_MODEL") == "qwen2.5-coder-0.5b"
    assert _sh_eval(line, "LOCALINFER_HOME") == "/state/home"


def test_no_system_prompt_unsets_it() -> None:
    """Without --system, a LOCALINFER_SYSTEM from the user's shell must not leak in."""
    out = launchers.render("m", None, BUNDLE_ID)
    assert "\nunset LOCALINFER_SYSTEM\n" in out["run.sh"]
    assert "export LOCALINFER_SYSTEM" not in out["run.sh"]
    assert "Remove-Item Env:LOCALINFER_SYSTEM" in out["run.ps1"]
    assert "$env:LOCALINFER_SYSTEM =" not in out["run.ps1"]


def _ps_eval(expr: str) -> str:
    """Evaluate the PowerShell string expressions _ps_quote writes: '...' literals (with ''
    for ') and [char]0xNNNN, joined by ' + '."""
    pos, units = 0, []
    token = re.compile(r"'((?:[^']|'')*)'|\[char\]0x([0-9A-Fa-f]{4})")
    while True:
        m = token.match(expr, pos)
        assert m, f"unexpected PowerShell at {expr[pos:]!r}"
        if m.group(2) is not None:
            units.append(int(m.group(2), 16).to_bytes(2, "little"))
        else:
            assert "\n" not in m.group(1)
            units.append(m.group(1).replace("''", "'").encode("utf-16-le"))
        pos = m.end()
        if pos == len(expr):
            return b"".join(units).decode("utf-16-le")
        assert expr.startswith(" + ", pos), expr[pos:]
        pos += 3


@pytest.mark.parametrize("system", ["Be brief.", "It's", NASTY, "Don’t ‘quote’ ‚me‛",
                                    "Ünïcödé đ 😀", "’leading and trailing’", "\n"])
def test_run_ps1_quotes_the_system_prompt(system: str) -> None:
    """run.ps1 sets the prompt with PowerShell single quotes, ' doubled; the file stays ASCII:
    PowerShell also ends '...' at typographic quotes, and Windows PowerShell 5.1 reads a .ps1
    without BOM as ANSI, so a raw ’ or đ (UTF-8 C4 91 = ANSI Ä‘) would end the string."""
    ps = launchers.render("smollm2-135m", system, BUNDLE_ID)["run.ps1"]
    assert ps.isascii()
    assert _placeholders(ps) == _placeholders(system)
    line = next(ln for ln in ps.splitlines() if ln.startswith("$env:LOCALINFER_SYSTEM = "))
    assert _ps_eval(line.removeprefix("$env:LOCALINFER_SYSTEM = ")) == system
    assert "$env:LOCALINFER_MODEL = 'smollm2-135m'" in ps


def test_run_ps1_plain_quote_doubling() -> None:
    assert launchers._ps_quote("It's $HOME") == "'It''s $HOME'"
    assert launchers._ps_quote("") == "''"


def test_run_sh_quoting_helper_is_shell_safe() -> None:
    """The default model is shell-quoted too (a path-derived name)."""
    text = launchers.render("a-b_c.d", None, BUNDLE_ID)["run.sh"]
    assert f"LOCALINFER_MODEL={shlex.quote('a-b_c.d')}" in text


# ---------------------------------------------------------------------------------------------
# janitor

_JANITOR_CHILD = """
import sys, time
from pathlib import Path
from localinfer.bundle.janitor import Janitor
folder = Path(sys.argv[1])
tmp = folder / ".out.partial-1"
(tmp / "sub").mkdir(parents=True)
(tmp / "sub" / "file").write_text("x")
janitor = Janitor(folder, [".out.partial-*"])
if sys.argv[2] == "release":
    janitor.release()
print("ready", flush=True)
if sys.argv[2] == "sleep":
    time.sleep(60)
"""


def _janitor_child(folder: Path, mode: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _JANITOR_CHILD, str(folder), mode],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


@posix_only
def test_janitor_removes_temp_files_after_kill_9(tmp_path: Path) -> None:
    """A builder killed with SIGKILL cannot clean up: its janitor must remove the partial
    folder, and only what its globs name."""
    (tmp_path / "keep.txt").write_text("keep")
    (tmp_path / "out").mkdir()
    proc = _janitor_child(tmp_path, "sleep")
    assert (tmp_path / ".out.partial-1" / "sub" / "file").exists()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()  # type: ignore[union-attr]
    deadline = time.monotonic() + 5
    while (tmp_path / ".out.partial-1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (tmp_path / ".out.partial-1").exists()
    assert (tmp_path / "keep.txt").read_text() == "keep"
    assert (tmp_path / "out").is_dir()


@posix_only
def test_janitor_released_leaves_files_alone(tmp_path: Path) -> None:
    """After release() (the output is in place) the janitor exits and removes nothing, even
    once the builder has exited."""
    proc = _janitor_child(tmp_path, "release")
    assert proc.wait(timeout=10) == 0
    proc.stdout.close()  # type: ignore[union-attr]
    time.sleep(0.5)
    assert (tmp_path / ".out.partial-1" / "sub" / "file").read_text() == "x"


def test_read_prompts_text_line_starting_with_bracket(tmp_path: Path) -> None:
    """A text file is read line by line even when a prompt starts with '['."""
    p = tmp_path / "prompts.txt"
    p.write_text("[draft] Name a colour.\n")
    assert demo.read_prompts(p) == ["[draft] Name a colour."]


# -- demo.compare: the smoke test's verdict ---------------------------------------------------

def _demo(ids: list[int], lps: list[float], runner_up: list[int], margins: list[float],
          text: str = "") -> demo.DemoPrompt:
    return demo.DemoPrompt("m", "p", None, 32, ids, text or " ".join(map(str, ids)), lps,
                           runner_up, margins)


RECORDED = _demo([5, 6, 7, 8], [-0.1, -0.9, -0.7, -0.2], [9, 3, 2, 4], [2.0, 0.5, 0.02, 1.5])


def test_compare_identical_passes() -> None:
    ok, what = demo.compare(RECORDED, _demo([5, 6, 7, 8], [-0.1, -0.95, -0.7, -0.21],
                                            [9, 3, 2, 4], [2.0, 0.5, 0.02, 1.5]))
    assert ok and "4 tokens match" in what


def test_compare_near_tie_to_the_runner_up_passes() -> None:
    """Another ISA's rounding may flip a near tie (here to EOS = 2, the recorded runner-up)."""
    ok, what = demo.compare(RECORDED, _demo([5, 6, 2], [-0.1, -0.9, -0.69], [9, 3, 7],
                                            [2.0, 0.5, 0.01]))
    assert ok and "near tie" in what


def test_compare_divergence_where_the_model_was_sure_fails() -> None:
    ok, what = demo.compare(RECORDED, _demo([5, 3, 7, 8], [-0.1, -0.9, -0.7, -0.2],
                                            [9, 6, 2, 4], [2.0, 0.5, 0.02, 1.5]))
    assert not ok and "token 1 differs" in what


def test_compare_tie_but_not_the_runner_up_fails() -> None:
    ok, _ = demo.compare(RECORDED, _demo([5, 6, 11], [-0.1, -0.9, -0.7], [9, 3, 7],
                                         [2.0, 0.5, 0.01]))
    assert not ok


def test_compare_drifting_logprobs_fail_even_with_equal_tokens() -> None:
    """Equal argmax is not enough: kernels that compute wrong probabilities fail."""
    ok, what = demo.compare(RECORDED, _demo([5, 6, 7, 8], [-0.1, -2.0, -0.7, -0.2],
                                            [9, 3, 2, 4], [2.0, 0.5, 0.02, 1.5]))
    assert not ok and "log-probabilities differ" in what


def test_compare_a_shorter_run_fails() -> None:
    ok, _ = demo.compare(RECORDED, _demo([5, 6], [-0.1, -0.9], [9, 3], [2.0, 0.5]))
    assert not ok


def test_demo_prompt_from_json_checks_lengths() -> None:
    data = RECORDED.to_json() | {"margins": [1.0]}
    with pytest.raises(BundleError):
        demo.DemoPrompt.from_json(data)
    assert demo.DemoPrompt.from_json(RECORDED.to_json()) == RECORDED


def test_an_archive_carrying_launcher_state_is_refused(tmp_path: Path) -> None:
    """A bundle zipped after use holds another machine's venv and compiled (pickled) kernels
    in .runtime/: verify, install and extract refuse it, naming the entry."""
    import tarfile

    from localinfer.bundle.opened import check_archive, opened

    src = tmp_path / "demo"
    (src / ".runtime" / "home" / "numba").mkdir(parents=True)
    (src / ".runtime" / "home" / "numba" / "k.nbi").write_bytes(b"\x80\x04pickle")
    (src / "manifest.json").write_text("{}")
    tar = tmp_path / "demo.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(src, arcname="demo")
    with pytest.raises(BundleError, match=r"demo/\.runtime"):
        check_archive(tar)
    with pytest.raises(BundleError, match="launcher state"), opened(tar, progress=False):
        pass


def test_owner_id_names_the_folder(tmp_path: Path) -> None:
    a, b = check.owner_id(str(tmp_path / "a")), check.owner_id(str(tmp_path / "b"))
    assert a != b and str(tmp_path / "a") in a


def test_an_interrupted_create_leaves_nothing(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the wheelhouse fills: KeyboardInterrupt goes on up (the CLI exits 130),
    and neither the bundle nor its partial folder is left."""
    from gguf_factory import write_tiny_llama

    from localinfer.bundle import create as C

    model = write_tiny_llama(tmp_path / "tiny.gguf")
    monkeypatch.setattr(C.demo, "generate", lambda *a, **k: [])
    own = tmp_path / "localinfer-0.1.0-py3-none-any.whl"
    own.write_bytes(b"PK")
    monkeypatch.setattr(C.wheelhouse, "build_own_wheel", lambda dest, **k: own)

    def interrupted_fill(target, wheel, extras, dest, **k):
        (dest / "numpy-2.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(C.wheelhouse, "fill", interrupted_fill)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(KeyboardInterrupt):
        C.create(C.CreateOptions(out=out / "demo", models=[str(model)], extras=[],
                                 progress=False))
    for _ in range(50):  # the janitor's last sweep runs in its own process
        if not list(out.iterdir()):
            break
        time.sleep(0.1)
    assert list(out.iterdir()) == []
