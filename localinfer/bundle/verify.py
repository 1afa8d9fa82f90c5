"""`bundle verify`: every file's size and hash, nothing missing or extra; `--smoke` also
replays the demo prompts and compares their greedy tokens with those recorded at build time."""

from __future__ import annotations

import sys
from pathlib import Path

from localinfer.bundle import check, demo
from localinfer.bundle.manifest import Manifest
from localinfer.bundle.opened import opened
from localinfer.progress import ProgressBar


def file_problems(root: Path, *, progress: bool) -> list[str]:
    """check.py's problems, with a progress bar over the bytes hashed."""
    try:
        manifest = check.load_manifest(str(root))
    except ValueError as exc:
        return [str(exc)]
    total = sum(int(v["size"]) for v in manifest["files"].values())
    with ProgressBar(total, "checking", enabled=None if progress else False) as bar:
        return check.problems(str(root), on_bytes=bar.update, manifest=manifest)


def verify(path: Path, *, smoke: bool = False, skip_check: bool = False,
           progress: bool = True) -> list[str]:
    """One line per problem ([] = the bundle is intact, and with `smoke` answers as recorded).
    Raises BundleError for a hostile archive or an unreadable manifest."""
    with opened(path, progress=progress) as root:
        found = [] if skip_check else file_problems(root, progress=progress)
        manifest = Manifest.load(root)
        if found or not smoke:
            return found
        by_model: dict[str, list[demo.DemoPrompt]] = {}
        for p in manifest.prompts:
            by_model.setdefault(p.model, []).append(p)
        if not by_model:
            return ["smoke: the manifest records no demo prompts"]
        out: list[str] = []
        for name, prompts in by_model.items():
            if progress:
                print(f"smoke: replaying {len(prompts)} demo prompt(s) on {name}",
                      file=sys.stderr, flush=True)
            out += demo.replay(manifest.model_file(root, name), prompts, progress=progress)
        return out
