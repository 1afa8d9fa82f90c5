"""`bundle create`: wheels, models, demo tokens and launchers in one folder or archive.

Order of work, cheapest failure first: resolve the models (pulling catalog ones), record the
demo prompts' greedy tokens on this machine, build localinfer's wheel, fill each target's
wheelhouse, copy the models (hashing as they go), write the launchers, the README and the
manifest, check the result with the same check the target will run, and only then put it in
place: a folder renamed from its temp name, or an archive written through a temp file. Until
then everything lives in a locked temp folder `.OUT.PID.TOKEN.part` beside the output
(atomic_file.temp_dir), which the janitor removes if this process is killed (janitor.py), and
the next writer's sweep if the janitor was killed too; an error or Ctrl-C removes it here, and
the janitor sweeps again after.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from localinfer.atomic_file import temp_dir
from localinfer.bundle import archive, check, demo, launchers, wheelhouse
from localinfer.bundle.janitor import Janitor
from localinfer.bundle.manifest import FORMAT, Manifest
from localinfer.bundle.targets import Target, parse_targets
from localinfer.catalog import sha256_file
from localinfer.errors import BundleError
from localinfer.progress import ProgressBar, human_bytes

DEFAULT_EXTRAS = ("server", "tui")


@dataclass(slots=True)
class CreateOptions:
    out: Path
    models: list[str]
    platforms: list[str] = field(default_factory=list)
    pythons: list[str] = field(default_factory=list)
    extras: list[str] = field(default_factory=lambda: list(DEFAULT_EXTRAS))
    prompts_file: Path | None = None
    system: str | None = None
    archive: str | None = None  # "zip" | "tar" | None (a folder)
    max_tokens: int = demo.DEFAULT_MAX_TOKENS
    progress: bool = True


@dataclass(slots=True)
class BundleModel:
    name: str
    path: Path
    info: dict[str, Any]  # the manifest's entry, less the hash


def create(opts: CreateOptions) -> Path:
    """Build the bundle; returns the output path (a folder, or OUT.zip / OUT.tar)."""
    start = time.monotonic()
    targets = parse_targets(opts.platforms, opts.pythons)
    final, root_name = _output(opts.out, opts.archive)
    if final.exists():
        raise BundleError(f"{final} already exists: remove it or choose another name")
    final.parent.mkdir(parents=True, exist_ok=True)
    models = [_resolve(m, opts.progress) for m in opts.models or [""]]
    if len({m.name for m in models}) < len(models) or \
            len({m.path.name for m in models}) < len(models):
        raise BundleError("two --model options name the same model or file name")
    prompts = demo.read_prompts(opts.prompts_file)
    # this process's temp folder and temp archive (atomic_file's names carry the pid)
    janitor = Janitor(final.parent, [f".{final.name}.{os.getpid()}.*.part"])
    try:
        with temp_dir(final.parent, final.name) as tmp:
            data = _build(tmp, opts, targets, models, prompts)
            found = check.problems(str(tmp))
            if found:
                raise BundleError(f"the new bundle fails its own check: {found[0]}")
            if opts.archive:
                archive.write_archive(tmp, final, opts.archive, root_name=root_name,
                                      progress=opts.progress)
            else:
                if final.exists():
                    raise BundleError(f"{final} appeared while the bundle was built")
                os.rename(tmp, final)
    except BaseException:
        janitor.abandon()  # and it sweeps once more, should a child still be writing
        raise
    janitor.release()
    if opts.progress:
        _summary(final, data, time.monotonic() - start)
    return final


def _output(out: Path, kind: str | None) -> tuple[Path, str]:
    if kind is None:
        return out, out.name
    if kind not in archive.ARCHIVE_KINDS:
        raise BundleError(f"unknown --archive {kind!r}: use {' or '.join(archive.ARCHIVE_KINDS)}")
    suffix = f".{kind}"
    final = out if out.suffix == suffix else out.with_name(out.name + suffix)
    return final, final.name[: -len(suffix)]


def _resolve(model: str, progress: bool) -> BundleModel:
    """A catalog name (pulled if needed) or a GGUF path, with what the manifest says of it."""
    from localinfer.catalog import Catalog
    from localinfer.gguf_file import open_gguf
    from localinfer.user_catalog import NAME_PATTERN

    catalog = Catalog.load()
    name = model or catalog.default
    path = catalog.resolve(name, progress=progress)
    with open_gguf(path) as g:
        meta, arch = g.metadata, g.arch
    entry = catalog.entries.get(name)
    if entry is not None:
        parts = entry.source.get("parts") or []
        version = ", ".join(f"{p['package']} {p['version']}" for p in parts) or \
            str(entry.source.get("revision") or entry.source.get("url") or "")
        info = {"name": name, "catalog": True, "license": entry.license or "unknown",
                "description": entry.description, "version": version, "sha256": entry.sha256}
    else:
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-._")[:64] or "model"
        name = stem if NAME_PATTERN.fullmatch(stem) else "model"
        info = {"name": name, "catalog": False,
                "license": str(meta.get("general.license") or "unknown"),
                "description": str(meta.get("general.name") or path.name),
                "version": str(meta.get("general.version") or "")}
    info.update(architecture=arch, file=f"models/{path.name}")
    return BundleModel(name, path, info)


def _build(tmp: Path, opts: CreateOptions, targets: list[Target], models: list[BundleModel],
           prompts: list[str]) -> dict[str, Any]:
    files: dict[str, dict[str, Any]] = {}
    recorded = []
    for m in models:
        if opts.progress:
            print(f"recording the demo prompts on {m.name} ...", file=sys.stderr, flush=True)
        recorded += demo.generate(m.path, m.name, prompts, opts.system, opts.max_tokens,
                                  progress=opts.progress)
    build = tmp / ".build"
    own = wheelhouse.build_own_wheel(build, progress=opts.progress)
    target_rows = []
    for t in targets:
        house = tmp / "wheels" / t.name
        house.mkdir(parents=True)
        shutil.copyfile(own, house / own.name)
        wheels = wheelhouse.fill(t, house / own.name, opts.extras, house,
                                 progress=opts.progress)
        wheelhouse.write_lock(t, wheels, opts.extras, house / wheelhouse.LOCK_NAME)
        for w in wheels:
            files[f"wheels/{t.name}/{w.path.name}"] = {"size": w.path.stat().st_size,
                                                        "sha256": w.sha256}
        target_rows.append({
            "name": t.name, "platform": t.platform, "python": t.python,
            "platform_tags": list(t.platform_tags),
            "lock": f"wheels/{t.name}/{wheelhouse.LOCK_NAME}",
            "packages": {w.name: {"version": w.version, "license": w.license}
                         for w in wheels}})
    shutil.rmtree(build)
    (tmp / "models").mkdir()
    for m in models:
        digest = _copy(m.path, tmp / m.info["file"], f"copying {m.name}", opts.progress)
        if m.info.get("sha256", digest) != digest:
            raise BundleError(f"{m.path} does not match the catalog's sha256 for {m.name}: "
                              f"the cached copy is damaged (localinfer pull {m.name} --force)")
        m.info.update(sha256=digest, size=m.path.stat().st_size)
    created = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    bundle_id = f"{models[0].name}-{created[:19].replace(':', '')}-{os.getpid()}"
    shutil.copyfile(Path(check.__file__), tmp / "check.py")
    for fname, text in launchers.render(models[0].name, opts.system, bundle_id).items():
        (tmp / fname).write_text(text, encoding="utf-8", newline="\n")
    (tmp / "run.sh").chmod(0o755)
    from localinfer import __version__

    (tmp / "README.txt").write_text(launchers.readme(
        [m.name for m in models], models[0].name, created, __version__,
        [t.name for t in targets], sorted({m.info["license"] for m in models})),
        encoding="utf-8")
    for p in sorted(tmp.rglob("*")):
        rel = p.relative_to(tmp).as_posix()
        if p.is_file() and rel not in files and rel not in (m.info["file"] for m in models):
            files[rel] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
    for m in models:
        files[m.info["file"]] = {"size": m.info["size"], "sha256": m.info["sha256"]}
    data = {
        "format": FORMAT, "id": bundle_id, "created": created,
        "localinfer": {"version": __version__, "commit": _commit(), "extras": opts.extras},
        "recorded_on": _machine(), "system": opts.system,
        "targets": target_rows, "models": [m.info for m in models],
        "prompts": [p.to_json() for p in recorded],
        "files": dict(sorted(files.items())),
    }
    Manifest(data).save(tmp)
    return data


def _copy(src: Path, dst: Path, label: str, progress: bool) -> str:
    import hashlib

    h = hashlib.sha256()
    size = src.stat().st_size
    with open(src, "rb") as fi, open(dst, "xb") as fo, \
            ProgressBar(size, label, enabled=None if progress else False) as bar:
        while block := fi.read(1 << 20):
            fo.write(block)
            h.update(block)
            bar.update(len(block))
    return h.hexdigest()


def _commit() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError, BundleError):
        src = wheelhouse.source_tree()
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return head.stdout.strip() + ("-dirty" if dirty else "")
    return ""


def _machine() -> dict[str, str]:
    from localinfer.backends.numba_cpu.isa import resolve_isa

    return {"machine": platform.machine(), "system": platform.system(),
            "python": platform.python_version(), "isa": resolve_isa(None),
            "cpu": _cpu_name()}


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def _summary(final: Path, data: dict[str, Any], seconds: float) -> None:
    files = data["files"]
    print(f"bundle: {final}", file=sys.stderr)
    for t in data["targets"]:
        size = sum(v["size"] for k, v in files.items() if k.startswith(f"wheels/{t['name']}/"))
        print(f"  wheels {t['name']:<24} {len(t['packages']):3d} wheels {human_bytes(size):>10}",
              file=sys.stderr)
    for m in data["models"]:
        print(f"  model  {m['name']:<24} {m['license']:>10} {human_bytes(m['size']):>10}",
              file=sys.stderr)
    total = final.stat().st_size if final.is_file() else sum(v["size"] for v in files.values())
    print(f"  total  {human_bytes(total)} in {seconds:.0f} s", file=sys.stderr)
