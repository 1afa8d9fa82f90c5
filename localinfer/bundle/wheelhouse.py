"""Wheelhouse: every wheel one target needs to install localinfer offline, and their lock.

pip downloads for the target's tags (targets.py), but it evaluates PEP 508 markers against the
building interpreter: from Linux it skips Windows-only `colorama`, from Python 3.11 it skips
3.10's `tomli`. So after pip has resolved, the closure is recomputed from the wheels' own
METADATA with the target's marker values; what is missing is downloaded (pinned, for the
target), what the target would never install is dropped, and the lock lists exactly the
closure with each wheel's sha256, for `pip install --no-index --require-hashes`.

A wheel is refused when it carries a `.pth` file (code that runs at every interpreter start)
other than the allow-listed ones, or a Numba cache file (pickled, CPU-specific machine code).
"""

from __future__ import annotations

import email.parser
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from localinfer.bundle.targets import Target
from localinfer.catalog import sha256_file
from localinfer.errors import BundleError
from localinfer.pip_run import run_pip

# .pth files that only adjust import paths of the package that ships them
PTH_ALLOWED = frozenset({"distutils-precedence.pth"})
LOCK_NAME = "requirements.lock"


@dataclass(slots=True)
class Wheel:
    path: Path
    name: str  # canonical
    version: str
    requires: list[Requirement]
    license: str
    sha256: str = ""
    extras: set[str] = field(default_factory=set)  # the extras the closure asks of it


def read_wheel(path: Path) -> Wheel:
    """Name, version, requirements and licence from a wheel's METADATA; refuses unsafe ones."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            _check_members(path.name, names)
            meta_name = next((n for n in names if n.count("/") == 1
                              and n.endswith(".dist-info/METADATA")), None)
            if meta_name is None:
                raise BundleError(f"wheel {path.name} has no .dist-info/METADATA")
            meta = email.parser.BytesParser().parsebytes(zf.read(meta_name), headersonly=True)
    except zipfile.BadZipFile as exc:
        raise BundleError(f"wheel {path.name} is not a valid zip file: {exc}") from exc
    if not meta.get("Name") or not meta.get("Version"):
        raise BundleError(f"wheel {path.name}: METADATA lacks Name or Version")
    try:
        requires = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    except InvalidRequirement as exc:
        raise BundleError(f"wheel {path.name}: bad Requires-Dist: {exc}") from exc
    license_ = (meta.get("License-Expression") or _short(meta.get("License"))
                or next((c.rsplit("::", 1)[-1].strip() for c in meta.get_all("Classifier") or []
                         if c.startswith("License ::")), "unknown"))
    return Wheel(path, canonicalize_name(meta["Name"]), str(meta["Version"]), requires, license_)


def _short(text: str | None) -> str:
    # some projects paste the whole licence text into License:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= 80 else ""


def _check_members(wheel: str, names: list[str]) -> None:
    for n in names:
        base = n.rsplit("/", 1)[-1]
        # site-packages' top level: the wheel's root, or its .data/purelib|platlib folder
        data = n.split(".data/", 1)[1] if ".data/" in n else ""
        top_level = "/" not in n or (data.startswith(("purelib/", "platlib/"))
                                     and data.count("/") == 1)
        if base.endswith(".pth") and top_level and base not in PTH_ALLOWED:
            raise BundleError(f"wheel {wheel} carries {n}, a .pth file that runs code at "
                              "interpreter start: refused")
        if base.endswith((".nbi", ".nbc")):
            raise BundleError(f"wheel {wheel} carries {n}, a Numba kernel cache (pickled, "
                              "CPU-specific): refused")


def source_tree() -> Path:
    """The localinfer source tree this process runs from (an editable install)."""
    import localinfer

    root = Path(localinfer.__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file() or 'name = "localinfer"' not in pyproject.read_text("utf-8"):
        raise BundleError("bundle create builds localinfer's wheel from its source tree, but "
                          f"this localinfer is installed without one ({root}); install it with "
                          "`pip install -e` from a checkout")
    return root


def build_own_wheel(dest: Path, *, progress: bool) -> Path:
    """localinfer's wheel, built from a clean copy of the source tree into `dest`.

    The copy leaves out what is not source (venvs, caches, tests, a previous build/ folder
    whose stale files setuptools would pack), and setuptools' build/ lands in it, not in the
    user's tree."""
    src = dest / "src"
    shutil.copytree(source_tree(), src, ignore=shutil.ignore_patterns(
        ".*", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", "*.nbi", "*.nbc",
        "tests", "tools"))
    _pip(["wheel", "--no-deps", "-w", str(dest), str(src)], progress,
         "building localinfer's wheel")
    shutil.rmtree(src)
    wheels = sorted(dest.glob("localinfer-*.whl"))
    if len(wheels) != 1:
        raise BundleError(f"building localinfer's wheel gave {len(wheels)} wheels in {dest}")
    return wheels[0]


def fill(target: Target, own_wheel: Path, extras: list[str], dest: Path, *,
         progress: bool) -> list[Wheel]:
    """Download `target`'s wheels of localinfer[extras] into `dest`; returns the closure."""
    extra = f"[{','.join(sorted(extras))}]" if extras else ""
    root = f"localinfer{extra} @ {own_wheel.resolve().as_uri()}"
    _pip(["download", *target.pip_args(), "-d", str(dest), root], progress,
         f"downloading wheels for {target.name}")
    for _ in range(20):  # each round adds what the target's markers ask for and pip skipped
        wheels = {w.name: w for w in map(read_wheel, sorted(dest.glob("*.whl")))}
        closure, missing = _closure(target, wheels, Requirement(f"localinfer{extra}"))
        if not missing:
            break
        _pip(["download", "--no-deps", *target.pip_args(), "-d", str(dest),
              *(str(_without_marker(r)) for r in missing)], progress,
             f"downloading {', '.join(r.name for r in missing)} for {target.name}")
    else:
        raise BundleError(f"{target.name}: the wheel closure does not converge")
    for w in wheels.values():
        if w.name not in closure:
            w.path.unlink()  # pip resolved it for this machine's markers, not the target's
    out = sorted(closure.values(), key=lambda w: w.name)
    for w in out:
        w.sha256 = sha256_file(w.path)
    return out


def _without_marker(req: Requirement) -> Requirement:
    r = Requirement(str(req))
    r.marker = None
    return r


def _closure(target: Target, wheels: dict[str, Wheel],
             root: Requirement) -> tuple[dict[str, Wheel], list[Requirement]]:
    env = target.marker_env()
    closure: dict[str, Wheel] = {}
    missing: list[Requirement] = []
    queue = [root]
    while queue:
        req = queue.pop()
        name = canonicalize_name(req.name)
        w = wheels.get(name)
        if w is None:
            if all(canonicalize_name(m.name) != name for m in missing):
                missing.append(req)
            continue
        if req.specifier and not req.specifier.contains(Version(w.version), prereleases=True):
            raise BundleError(f"{target.name}: {w.path.name} does not satisfy {req} "
                              "(the wheels' requirements conflict for this target)")
        new_extras = set(req.extras) - w.extras
        if name in closure and not new_extras:
            continue
        w.extras |= new_extras
        closure[name] = w
        for dep in w.requires:
            wanted = dep.marker is None or any(
                dep.marker.evaluate({**env, "extra": e}) for e in ("", *sorted(w.extras)))
            if wanted:
                queue.append(dep)
    return closure, missing


def write_lock(target: Target, wheels: list[Wheel], extras: list[str], path: Path) -> None:
    """The hash-pinned requirements file pip installs from on the target."""
    lines = [f"# localinfer bundle: the wheels for {target.name}, each pinned by its sha256",
             "# pip install --no-index --find-links . --require-hashes -r " + LOCK_NAME]
    for w in wheels:
        extra = f"[{','.join(sorted(extras))}]" if w.name == "localinfer" and extras else ""
        lines.append(f"{w.name}{extra}=={w.version} --hash=sha256:{w.sha256}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _pip(args: list[str], progress: bool, what: str) -> None:
    run_pip(args, label=what, progress=progress, error=BundleError, die_with_parent=True)
