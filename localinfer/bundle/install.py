"""`bundle install`: a bundle's models into the local model cache and the user's catalog.

Every file is checked first (nothing is placed from a damaged bundle). A model the installed
catalog knows by the same name and sha256 lands where `localinfer pull` would put it; any other
model is registered in the user's catalog (user_catalog.py) under the bundle's name for it. Both
are hard links where the file system allows, else copies, so `localinfer run NAME` works
afterwards and keeps working when the bundle is deleted.
"""

from __future__ import annotations

import sys
from pathlib import Path

from localinfer.bundle.manifest import Manifest
from localinfer.bundle.opened import opened
from localinfer.bundle.verify import file_problems
from localinfer.errors import BundleError


def install(path: Path, *, skip_check: bool = False, progress: bool = True) -> list[str]:
    """Install the models; returns the names `localinfer run --model` now accepts."""
    from localinfer.catalog import Catalog
    from localinfer.user_catalog import place_file, register

    with opened(path, progress=progress) as root:
        if not skip_check:
            found = file_problems(root, progress=progress)
            if found:
                more = f" (and {len(found) - 1} more problems)" if len(found) > 1 else ""
                raise BundleError(f"not installing from a damaged bundle: {found[0]}{more}")
        manifest = Manifest.load(root)
        catalog = Catalog.load()
        names = []
        for m in manifest.models:
            src = manifest.model_file(root, m["name"])
            entry = catalog.entries.get(m["name"])
            if entry is not None and entry.sha256 == m["sha256"] and entry.file == src.name:
                place_file(src, catalog.path_of(entry))
                name = entry.name
            else:
                name = m["name"] if entry is None else f"{m['name']}-bundle"
                register(name, src, sha256=m["sha256"], license=m.get("license", ""),
                         description=m.get("description") or f"from the bundle {path}",
                         source={"type": "bundle", "path": str(path.resolve())})
            names.append(name)
            if progress:
                print(f"installed {name}", file=sys.stderr)
        return names
