"""The GGUF fuzzer's child process: atheris (libFuzzer, coverage-guided) over gguf_target.

    python -m localinfer.fuzz.gguf_atheris STATS_JSON FINDINGS_DIR CASE_FILE -- LIBFUZZER_ARGS

The localinfer modules are instrumented for coverage. A case never raises into libFuzzer: a
crash (an exception that is not a LocalInferError) or a hang (a case over HANG_S) is counted,
its input saved under FINDINGS_DIR, and fuzzing goes on, so one run measures them all. A case
over HANG_S runs again: a hang is the input's, so it must be slow twice; slow once then fast
is the machine stalling (a shared machine, a collection), counted apart as a stall.
libFuzzer ends the process with exit() (no Python cleanup), so the figures are written to
STATS_JSON as they change and at least every STATS_EVERY_S.
"""

from __future__ import annotations

import hashlib
import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HANG_S = 1.0
STATS_EVERY_S = 0.5
MAX_EXAMPLES_KEPT = 20


class Tally:
    def __init__(self, stats: Path, findings: Path, last: int = -1) -> None:
        self.stats, self.findings, self.last = stats, findings, last  # last: the run limit
        self.figures: dict[str, Any] = {"cases": 0, "loads": 0, "refused": 0, "crashes": 0,
                                        "hangs": 0, "stalls": 0, "slowest_s": 0.0,
                                        "examples": []}
        self.written = 0.0

    def case(self, data: bytes, outcome: str, seconds: float, detail: str,
             retime: Callable[[], float]) -> None:
        """Count one case; `retime` runs it again and returns its seconds."""
        f = self.figures
        f["cases"] += 1
        f[outcome] += 1
        if seconds > HANG_S and outcome != "crashes":
            again = retime()
            if again <= HANG_S:
                f["stalls"] += 1
            seconds = min(seconds, again)
        if seconds > f["slowest_s"]:  # kept: the case nearest to a hang
            f["slowest_s"] = seconds
            (self.findings / "slowest").write_bytes(data)
        finding = "crash" if outcome == "crashes" else "hang" if seconds > HANG_S else None
        if finding == "hang":
            f["hangs"] += 1
        if finding is not None:
            name = f"{finding}-{hashlib.sha1(data).hexdigest()[:12]}"
            (self.findings / name).write_bytes(data)
            if len(f["examples"]) < MAX_EXAMPLES_KEPT:
                f["examples"].append({"kind": finding, "file": name, "seconds": seconds,
                                      "detail": detail})
        now = time.monotonic()
        if finding is not None or now - self.written > STATS_EVERY_S or f["cases"] == self.last:
            self.write()
            self.written = now

    def write(self) -> None:
        self.figures["peak_rss_kb"] = peak_rss_kb()
        tmp = self.stats.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.figures))
        tmp.replace(self.stats)



def peak_rss_kb() -> int:
    """This process's peak resident size: VmHWM, its own memory's high-water mark. Not
    ru_maxrss, which a process started by vfork + exec (subprocess's way) inherits from the
    parent's memory: under a test suite that grew past a GB, the fuzzer reported 1.5 GB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(argv: list[str]) -> None:
    import atheris

    stats, findings, case = (Path(a) for a in argv[1:4])
    findings.mkdir(parents=True, exist_ok=True)
    with atheris.instrument_imports(include=["localinfer"]):
        # what gguf_target.load imports when first called, instrumented now
        import localinfer.chat_template  # noqa: F401
        import localinfer.gguf_checks  # noqa: F401
        import localinfer.gguf_file  # noqa: F401
        import localinfer.gguf_parse  # noqa: F401
        import localinfer.gguf_strings  # noqa: F401
        import localinfer.model_config  # noqa: F401
        import localinfer.model_info  # noqa: F401
        import localinfer.tokenizer.factory  # noqa: F401
        from localinfer.fuzz import gguf_target
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    runs = [int(a.split("=", 1)[1]) for a in rest if a.startswith("-runs=")]
    tally = Tally(stats, findings, runs[-1] if runs else -1)
    tally.write()

    def one(data: bytes) -> None:
        tally.case(data, *gguf_target.timed_case(data, case),
                   retime=lambda: gguf_target.timed_case(data, case)[1])

    atheris.Setup([argv[0], *rest], one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
