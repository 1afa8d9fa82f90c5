"""The bundle's launchers (run.sh, run.ps1) and the README for whoever receives it.

First run on a target: check every file's hash with check.py (standard library only, before
anything of the bundle is installed or imported), make a venv with the target's own python3
from the wheelhouse alone (`pip --no-index --require-hashes`), link the models into the bundle's
own localinfer home, and run the demo prompts once — which compiles the kernels for this CPU
(never shipped: Numba's cache is pickled and CPU-specific) and proves they give the recorded
tokens. A venv is complete only once its marker file is written, so an interrupted first run
starts over. Later runs go straight to `localinfer`, with the bundled model as the default.

The state lives in the bundle's `.runtime/` folder, or, when the bundle sits on read-only media,
in the user's cache folder under the bundle's id.
"""

from __future__ import annotations

import shlex
from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")


def _template(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


def _ps_quote(text: str) -> str:
    """A PowerShell expression for `text`, in printable ASCII only: PowerShell ends a '...'
    string at a typographic single quote (U+2018..U+201B) too, and Windows PowerShell 5.1 reads
    a .ps1 without a BOM in the ANSI code page (where UTF-8 bytes can decode to such quotes).
    So ' is doubled and anything else outside printable ASCII is spelled [char]0xNNNN."""
    parts: list[str] = []
    lit = ""
    for c in text:
        if " " <= c <= "~":
            lit += "''" if c == "'" else c
            continue
        if lit or not parts:  # a string first, so that + concatenates
            parts.append(f"'{lit}'")
            lit = ""
        units = c.encode("utf-16-le", "surrogatepass")
        parts += [f"[char]0x{int.from_bytes(units[i:i + 2], 'little'):04X}"
                  for i in range(0, len(units), 2)]
    if lit or not parts:
        parts.append(f"'{lit}'")
    return " + ".join(parts)


def render(default_model: str, system: str | None, bundle_id: str) -> dict[str, str]:
    """run.sh and run.ps1 for a bundle whose default model is `default_model`."""
    # the bundle id first: a system prompt may contain any text, "@BUNDLE_ID@" included
    sh = _template("run.sh").replace("@BUNDLE_ID@", bundle_id)
    sh = sh.replace("@DEFAULT_MODEL@", shlex.quote(default_model))
    sh = sh.replace("@SYSTEM_SH@", f"export LOCALINFER_SYSTEM={shlex.quote(system)}"
                    if system else "unset LOCALINFER_SYSTEM")
    ps = _template("run.ps1").replace("@BUNDLE_ID@", bundle_id)
    ps = ps.replace("@DEFAULT_MODEL_PS@", _ps_quote(default_model))
    ps = ps.replace("@SYSTEM_PS@", f"$env:LOCALINFER_SYSTEM = {_ps_quote(system)}"
                    if system else "Remove-Item Env:LOCALINFER_SYSTEM -ErrorAction Ignore")
    return {"run.sh": sh, "run.ps1": ps}


def readme(models: list[str], default_model: str, created: str, version: str,
           targets: list[str], licenses: list[str]) -> str:
    return (_template("README.txt").replace("@MODELS@", ", ".join(models))
            .replace("@DEFAULT_MODEL_TEXT@", default_model)
            .replace("@CREATED@", created).replace("@VERSION@", version)
            .replace("@TARGETS@", ", ".join(targets))
            .replace("@LICENSES@", ", ".join(licenses) or "see manifest.json"))
