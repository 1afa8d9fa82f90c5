"""`localinfer fuzz gguf`: fuzz the GGUF reader over a seed corpus, bounded in cases and time.

With atheris installed, a child process runs libFuzzer (coverage-guided) over the seeds
(gguf_atheris.py); without it, random mutations run here (gguf_mutate.py). Either way the
figures are: cases run, how many loaded and how many were refused with a clear error, crashes
(any other exception), hangs (a case over 1 s), the slowest case and the peak memory (RSS) of
the process that ran them. The inputs behind crashes and hangs are kept in the work folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localinfer.fuzz.gguf_atheris import HANG_S
from localinfer.fuzz.gguf_seeds import write_corpus

MAX_LEN = 1 << 16  # a seed head is a few KB; room for mutations to grow it
_DONE = re.compile(r"Done (\d+) runs in (\d+) second")


@dataclass
class GgufReport:
    engine: str
    seeds: int
    cases: int = 0
    loads: int = 0
    refused: int = 0
    crashes: int = 0
    hangs: int = 0  # over HANG_S, and again when rerun
    stalls: int = 0  # over HANG_S once, under it when rerun: the machine, not the input
    slowest_s: float = 0.0
    peak_rss_mb: float = 0.0
    seconds: float = 0.0
    examples: list[dict[str, Any]] = field(default_factory=list)
    work: str = ""

    @property
    def ok(self) -> bool:
        return self.crashes == 0 and self.hangs == 0


def fuzz_gguf(cases: int, seconds: float, models: list[Path], work: Path | None = None,
              engine: str | None = None) -> GgufReport:
    """Run up to `cases` cases for up to `seconds`; `models` are the real seeds' sources.
    `engine`: "atheris" or "mutation" (None: atheris if it is installed)."""
    work = work or Path(tempfile.mkdtemp(prefix="localinfer-fuzz-gguf-"))
    seeds = write_corpus(work / "seeds", models)
    findings = work / "findings"
    findings.mkdir(parents=True, exist_ok=True)
    case = _case_path(work)
    if engine is None:
        engine = "atheris" if importlib.util.find_spec("atheris") else "mutation"
    start = time.monotonic()
    if engine == "atheris":
        report = _atheris(cases, seconds, work, findings, case, len(seeds))
    else:
        report = _mutation(cases, seconds, [p.read_bytes() for p in seeds], findings, case)
    report.seconds = time.monotonic() - start
    report.work = str(work)
    case.unlink(missing_ok=True)
    if case.parent != work:
        case.parent.rmdir()  # its own folder in /dev/shm
    return report


def _case_path(work: Path) -> Path:
    """The case file: in /dev/shm where there is one (a write per case; no disk wear)."""
    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else work
    return folder / "case.gguf"


def _atheris(cases: int, seconds: float, work: Path, findings: Path, case: Path,
             n_seeds: int) -> GgufReport:
    corpus = work / "corpus"  # libFuzzer adds the inputs that found new coverage here
    corpus.mkdir(exist_ok=True)
    stats = work / "stats.json"
    cmd = [sys.executable, "-m", "localinfer.fuzz.gguf_atheris", str(stats), str(findings),
           str(case), "--", f"-runs={cases}", f"-max_total_time={max(int(seconds), 1)}",
           "-timeout=30", "-rss_limit_mb=4096", f"-max_len={MAX_LEN}",
           f"-artifact_prefix={findings}/", str(corpus), str(work / "seeds")]
    log = work / "libfuzzer.log"
    with open(log, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    figures = json.loads(stats.read_text()) if stats.exists() else {}
    report = GgufReport("atheris (libFuzzer)", n_seeds, **_known(figures))
    done = _DONE.findall(log.read_text(errors="replace"))
    if done:  # libFuzzer's own count; the stats file may trail it by up to STATS_EVERY_S, in
        # which no crash or hang happened (they are written at once): loads + refused <= cases
        report.cases = max(report.cases, int(done[-1][0]))
    # libFuzzer's own findings: a case over -timeout, or over the memory limit
    for artifact in findings.glob("timeout-*"):
        report.hangs += 1
        report.examples.append({"kind": "hang", "file": artifact.name})
    for artifact in [*findings.glob("oom-*"), *findings.glob("crash-*")]:
        report.crashes += 1
        report.examples.append({"kind": artifact.name.split("-")[0], "file": artifact.name})
    if proc.returncode != 0 and not report.examples:
        report.crashes += 1
        report.examples.append({"kind": "exit", "detail": f"fuzzer exited {proc.returncode}; "
                                f"see {log}"})
    # the fuzzer's own peak (RUSAGE_CHILDREN would be the largest child this process ever
    # waited for: under a test suite, a model server's)
    report.peak_rss_mb = figures.get("peak_rss_kb", 0) / 1024
    return report


def _known(figures: dict[str, Any]) -> dict[str, Any]:
    names = ("cases", "loads", "refused", "crashes", "hangs", "stalls", "slowest_s", "examples")
    return {k: figures[k] for k in names if k in figures}


def _mutation(cases: int, seconds: float, seeds: list[bytes], findings: Path,
              case: Path) -> GgufReport:
    from localinfer.fuzz.gguf_atheris import Tally
    from localinfer.fuzz.gguf_mutate import mutate
    from localinfer.fuzz.gguf_target import timed_case

    tally = Tally(findings / "stats.json", findings)
    rng = random.Random(0)
    end = time.monotonic() + seconds
    peak = _rss_bytes()
    while tally.figures["cases"] < cases and time.monotonic() < end:
        data = mutate(rng.choice(seeds), seeds, rng)
        tally.case(data, *timed_case(data, case),
                   retime=lambda data=data: timed_case(data, case)[1])
        peak = max(peak, _rss_bytes())
    tally.write()
    report = GgufReport("mutation (random, in-process)", len(seeds), **_known(tally.figures))
    # in-process, so not the process's lifetime peak (a test suite's may be a loaded model's):
    # the largest resident size seen after a case
    report.peak_rss_mb = peak / (1 << 20)
    return report


def _rss_bytes() -> int:
    """This process's resident size now (its lifetime peak where /proc is missing)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return pages * os.sysconf("SC_PAGE_SIZE")


__all__ = ["HANG_S", "GgufReport", "fuzz_gguf"]
