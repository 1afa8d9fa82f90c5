"""Manifest: what a bundle holds (manifest.json), read back with its structure checked.

JSON only (never a pickle). `files` maps every file but the manifest itself to its size and
sha256 (check.py verifies them); `models` names each GGUF with its licence and version;
`targets` lists the wheelhouses; `prompts` holds the demo prompts with their recorded tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localinfer.bundle import check
from localinfer.bundle.demo import DemoPrompt
from localinfer.errors import BundleError

FORMAT = "localinfer-bundle/1"


@dataclass(slots=True)
class Manifest:
    data: dict[str, Any]

    @classmethod
    def load(cls, root: Path) -> Manifest:
        try:
            data = check.load_manifest(str(root))
        except ValueError as exc:
            raise BundleError(str(exc)) from None
        if data.get("format") != FORMAT:
            raise BundleError(f"{root}: manifest format {data.get('format')!r} is not "
                              f"{FORMAT!r} (made by another localinfer version?)")
        models = data.get("models")
        if not isinstance(models, list) or not models or not all(
                isinstance(m, dict) and isinstance(m.get("name"), str)
                and check.safe_relpath(m.get("file")) and m["file"] in data["files"]
                for m in models):
            raise BundleError(f"{root}: manifest lists no models, or a model whose file it "
                              "does not list")
        return cls(data)

    def save(self, root: Path) -> None:
        text = json.dumps(self.data, indent=2, ensure_ascii=False) + "\n"
        (root / check.MANIFEST).write_text(text, encoding="utf-8")

    @property
    def models(self) -> list[dict[str, Any]]:
        return list(self.data["models"])

    @property
    def default_model(self) -> str:
        return str(self.data["models"][0]["name"])

    @property
    def prompts(self) -> list[DemoPrompt]:
        return [DemoPrompt.from_json(p) for p in self.data.get("prompts", [])]

    def model_file(self, root: Path, name: str) -> Path:
        for m in self.data["models"]:
            if m["name"] == name:
                return root.joinpath(*m["file"].split("/"))
        raise BundleError(f"the bundle has no model {name!r}")
