"""Target: one (platform, Python) pair a bundle carries wheels for.

A wheelhouse must hold exactly the wheels the target machine's pip would pick, never the building
machine's, so each target states everything pip's download needs (`--platform` tags, Python
version, implementation, ABIs) and the values PEP 508 markers take there (pip evaluates markers
against the building interpreter; the wheelhouse closes the gaps with these, wheelhouse.py).

pip expands macOS tags to older releases itself but not `manylinux_2_X` tags, so the Linux lists
name every glibc baseline from manylinux2014 (2.17) to 2.28 — a target needs glibc ≥ 2.28
(Debian 10, Ubuntu 20.04, RHEL 8) for numpy and numba's current wheels.
"""

from __future__ import annotations

import platform
import re
import sys
from dataclasses import dataclass

from localinfer.errors import BundleError

PLATFORMS = ("linux-x86_64", "linux-aarch64", "macos-arm64", "windows-amd64")


def _manylinux(arch: str) -> tuple[str, ...]:
    return (f"manylinux2014_{arch}",) + tuple(
        f"manylinux_2_{minor}_{arch}" for minor in range(17, 29))


# platform -> (pip --platform tags, sys_platform, platform_system, platform_machine, os_name)
_PLATFORM_FACTS: dict[str, tuple[tuple[str, ...], str, str, str, str]] = {
    "linux-x86_64": (_manylinux("x86_64"), "linux", "Linux", "x86_64", "posix"),
    "linux-aarch64": (_manylinux("aarch64"), "linux", "Linux", "aarch64", "posix"),
    "macos-arm64": (("macosx_14_0_arm64",), "darwin", "Darwin", "arm64", "posix"),
    "windows-amd64": (("win_amd64",), "win32", "Windows", "AMD64", "nt"),
}


@dataclass(frozen=True, slots=True)
class Target:
    platform: str  # one of PLATFORMS
    python: str  # "3.11"

    @property
    def name(self) -> str:
        """The wheelhouse folder: linux-x86_64-cp311; the launchers compute the same string."""
        return f"{self.platform}-cp{self.python.replace('.', '')}"

    @property
    def platform_tags(self) -> tuple[str, ...]:
        return _PLATFORM_FACTS[self.platform][0]

    def pip_args(self) -> list[str]:
        """`pip download` options that select this target's wheels and nothing else."""
        abi = f"cp{self.python.replace('.', '')}"
        args = ["--only-binary=:all:", "--python-version", self.python, "--implementation", "cp"]
        for tag in self.platform_tags:
            args += ["--platform", tag]
        for a in (abi, "abi3", "none"):
            args += ["--abi", a]
        return args

    def marker_env(self) -> dict[str, str]:
        """PEP 508 marker values on the target (for packaging.markers.Marker.evaluate)."""
        _, sys_platform, system, machine, os_name = _PLATFORM_FACTS[self.platform]
        return {
            "implementation_name": "cpython",
            "implementation_version": f"{self.python}.0",
            "os_name": os_name,
            "platform_machine": machine,
            "platform_python_implementation": "CPython",
            "platform_release": "",
            "platform_system": system,
            "platform_version": "",
            "python_full_version": f"{self.python}.0",
            "python_version": self.python,
            "sys_platform": sys_platform,
        }


def host_platform() -> str:
    machine = platform.machine().lower()
    system = sys.platform
    if system.startswith("linux") and machine in ("x86_64", "amd64"):
        return "linux-x86_64"
    if system.startswith("linux") and machine in ("aarch64", "arm64"):
        return "linux-aarch64"
    if system == "darwin" and machine == "arm64":
        return "macos-arm64"
    if system == "win32" and machine in ("amd64", "x86_64"):
        return "windows-amd64"
    raise BundleError(f"this machine ({system} {machine}) is not a bundle platform; "
                      f"name one with --platform ({', '.join(PLATFORMS)})")


def parse_targets(platforms: list[str], pythons: list[str]) -> list[Target]:
    """Targets for `--platform` values (host = this machine) × `--python` versions."""
    if not platforms:
        platforms = ["host"]
    if not pythons:
        pythons = [f"{sys.version_info[0]}.{sys.version_info[1]}"]
    out: list[Target] = []
    for raw in platforms:
        for p in (x.strip() for x in raw.split(",") if x.strip()):
            name = host_platform() if p == "host" else p
            if name not in _PLATFORM_FACTS:
                raise BundleError(f"unknown platform {p!r}: use host or one of "
                                  f"{', '.join(PLATFORMS)}")
            for raw_py in pythons:
                for py in (x.strip() for x in raw_py.split(",") if x.strip()):
                    if not re.fullmatch(r"3\.(1[0-9]|[2-9][0-9])", py):
                        raise BundleError(f"invalid --python {py!r}: use e.g. 3.11 (3.10 or "
                                          "newer, as localinfer needs)")
                    target = Target(name, py)
                    if target not in out:
                        out.append(target)
    return out
