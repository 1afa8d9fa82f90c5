"""Check an offline localinfer bundle's files against its manifest.json.

Every file the manifest lists must be there with its size and sha256, none may be missing, and
nothing else may be there (no symlinks, no extra files) but the launchers' own state folder.
Standard library only, and the same file is copied into each bundle as `check.py`: the launchers
run it with the target's python3 before anything from the bundle is installed or imported, and
`localinfer bundle verify` runs this module.

    python3 check.py [BUNDLE_DIR]   # exit 1 and one line per problem when anything is wrong
    python3 check.py --target       # this interpreter's wheelhouse name, e.g. linux-x86_64-cp311
    python3 check.py --owner DIR    # who may use DIR/.runtime: this folder, machine and CPU
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from collections.abc import Callable

MANIFEST = "manifest.json"
STATE_DIR = ".runtime"  # the launchers' venvs and home: made on the target, never shipped
CHUNK = 1 << 20


def target_name() -> str:
    """The wheelhouse folder this interpreter installs from (targets.Target.name)."""
    machine = platform.machine().lower()
    if sys.platform.startswith("linux"):
        plat = "linux-" + {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    elif sys.platform == "darwin":
        plat = "macos-" + {"aarch64": "arm64"}.get(machine, machine)
    elif sys.platform == "win32":
        plat = "windows-" + {"x86_64": "amd64"}.get(machine, machine)
    else:
        plat = f"{sys.platform}-{machine}"
    return f"{plat}-cp{sys.version_info[0]}{sys.version_info[1]}"


def owner_id(root: str) -> str:
    """The launchers' state is this folder's on this machine and CPU only: a copied bundle's
    venv points at the old folder, and its compiled kernels are another CPU's."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith(
                ("model name", "Model", "CPU part"))), cpu)
    except OSError:
        pass
    return f"{os.path.abspath(root)}|{platform.node()}|{platform.machine()}|{cpu}"


def safe_relpath(name: object) -> bool:
    """A manifest path must stay inside the bundle: relative, posix, no '..', no drive."""
    if not isinstance(name, str) or not name or name.startswith(("/", "\\")) or "\\" in name:
        return False
    parts = name.split("/")
    return all(p not in ("", ".", "..") for p in parts) and ":" not in parts[0] \
        and not any(ord(c) < 32 for c in name)


def load_manifest(root: str) -> dict:
    path = os.path.join(root, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (not a localinfer bundle?)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable: {exc}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        raise ValueError(f"{path}: no 'files' table")
    for name, spec in files.items():
        if not safe_relpath(name):
            raise ValueError(f"{path}: unsafe file name {name!r}")
        if not (isinstance(spec, dict) and isinstance(spec.get("size"), int)
                and isinstance(spec.get("sha256"), str) and len(spec["sha256"]) == 64):
            raise ValueError(f"{path}: bad entry for {name!r}")
    return manifest


def problems(root: str, on_bytes: Callable[[int], None] | None = None,
             manifest: dict | None = None) -> list[str]:
    """One line per problem with the bundle at `root`; [] when every file checks out.
    `manifest`: load_manifest(root), when the caller has it already."""
    if manifest is None:
        try:
            manifest = load_manifest(root)
        except ValueError as exc:
            return [str(exc)]
    files: dict[str, dict] = manifest["files"]
    out: list[str] = []
    present = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        if rel_dir == ".":
            rel_dir = ""
            dirnames[:] = [d for d in dirnames if d != STATE_DIR]
        for d in list(dirnames):
            if os.path.islink(os.path.join(dirpath, d)):  # os.walk does not descend into it
                out.append(f"unexpected symlink: {rel_dir + '/' if rel_dir else ''}{d}")
        for fn in filenames:
            rel = f"{rel_dir}/{fn}" if rel_dir else fn
            if rel == MANIFEST:
                continue
            full = os.path.join(dirpath, fn)
            if os.path.islink(full) or not os.path.isfile(full):
                out.append(f"unexpected {'symlink' if os.path.islink(full) else 'entry'}: {rel}")
            elif rel not in files:
                out.append(f"unexpected file: {rel} (not in the manifest)")
            else:
                present.add(rel)
    for rel in sorted(files):
        spec = files[rel]
        if rel not in present:
            out.append(f"missing file: {rel}")
            continue
        full = os.path.join(root, *rel.split("/"))
        size = os.path.getsize(full)
        if size != spec["size"]:
            out.append(f"wrong size: {rel} has {size} bytes, the manifest says {spec['size']}")
            continue
        h = hashlib.sha256()
        with open(full, "rb") as f:
            while block := f.read(CHUNK):
                h.update(block)
                if on_bytes is not None:
                    on_bytes(len(block))
        if h.hexdigest() != spec["sha256"]:
            out.append(f"checksum mismatch: {rel} (sha256 {h.hexdigest()}, the manifest says "
                       f"{spec['sha256']}): the file is damaged")
    return out


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--target"]:
        print(target_name())
        return 0
    if argv[1:2] == ["--owner"] and len(argv) == 3:
        print(owner_id(argv[2]))
        return 0
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    found = problems(root)
    for line in found:
        print(f"bundle check: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
