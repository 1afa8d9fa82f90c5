"""Crash safety of every writer (RELIABILITY.md #31): kill -9 at random moments and full disks.

    PYTHONPATH=. python tools/crash_writers.py [--runs 30] [--writers quantize,...] [--seed 0]

For each writer (tools/crash_cases.py: quantize, convert, register, pull, bundle-extract,
bundle-install, chat-save) a clean run first gives the new state of its targets and its
duration D. Then `--runs` runs alternate:
- kill: start it on a fresh folder holding the old targets, SIGKILL it after U(0, D), or for
  every other kill U(0, W) after its first change on disk, W being how long the clean run kept
  changing files (most of a tiny run is Python starting; this puts half the kills in the write);
- full disk: the same on a tmpfs mounted for the run (root only) with room for the old targets
  plus U(5%, 90%) of what the run adds, so the write runs out of space part-way.
After each run every target must be absent-as-before, the old complete file or (only if the
run got that far) the new complete one, validated by reading it (tools/crash_cases.py). Temp
files are counted when the writer is dead and again after the sweep its next run does
(atomic_file.remove_stale_temps on each folder): that second count is what a user keeps.
A full-disk run that fails must exit non-zero with one clear `localinfer: error:` line.

This is a command, not a test (tests/test_crash_writers.py runs a handful per writer): it needs
tests/' generators, root for the tmpfs, and minutes; it is a check of the project, not a
feature of the installed app, so it lives beside the other tools rather than in the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crash_cases import CASES, Case, make_inputs  # noqa: E402

from localinfer.atomic_file import remove_stale_temps  # noqa: E402

PAGE = 4096


@dataclass
class Tally:
    writer: str
    kill_runs: int = 0
    killed_mid_write: int = 0  # a temp file existed at the moment of the kill
    enospc_runs: int = 0
    enospc_failed: int = 0  # ran out of space (non-zero exit) rather than finishing
    clear_errors: int = 0
    corrupt: int = 0
    temps_at_death: int = 0
    leftovers: int = 0  # after the next run's sweep: what the user keeps
    problems: list[str] | None = None
    sample_errors: list[str] | None = None  # the first full-disk error lines, as users see them


def hidden(disk: Path) -> list[Path]:
    """Every temp entry under disk: all writers' temps are dot-named."""
    return [Path(top, n) for top, dirs, files in os.walk(disk) for n in dirs + files
            if n.startswith(".")]


def snapshot(disk: Path) -> set[tuple[str, int]]:
    """Every path under disk with its size (folders vanish while it walks: skipped)."""
    found = set()
    for top, dirs, files in os.walk(disk):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                found.add((name, os.lstat(os.path.join(top, name)).st_size))
    return found


def used_bytes(disk: Path) -> int:
    """Pages the files take (a hard-linked file once)."""
    sizes = {(st.st_dev, st.st_ino): st.st_size
             for st in (p.stat() for p in disk.rglob("*") if p.is_file())}
    return sum(-(-n // PAGE) * PAGE for n in sizes.values())


class Quiet(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a killed pull resets its connection: expected here


class Runner:
    def __init__(self, work: Path, seed: int, enospc: bool) -> None:
        self.work, self.rng, self.enospc = work, random.Random(seed), enospc
        self.inputs, self.disk, self.tmpdir = work / "inputs", work / "disk", work / "tmpdir"
        self.window: dict[str, tuple[float, float]] = {}  # writer -> (first, last change) in s
        from localinfer import paths

        self.kernels = paths.kernel_cache_dir()  # the user's, before LOCALINFER_HOME moves
        make_inputs(self.inputs)
        handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                                    directory=str(self.inputs / "pulled"))
        handler.log_message = lambda *a: None  # type: ignore[attr-defined]
        self.httpd = Quiet(("127.0.0.1", 0), handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        (self.inputs / "pull_url.txt").write_text(
            f"http://127.0.0.1:{self.httpd.server_address[1]}")

    def close(self) -> None:
        self.httpd.shutdown()

    def env(self, disk: Path) -> dict[str, str]:
        # PYTHONPATH as given: the checkout under test (or none: the installed localinfer)
        # $TMPDIR (bundle install extracts there) is off the small disk, as /tmp usually is
        return dict(os.environ, LOCALINFER_HOME=str(disk / "home"), TMPDIR=str(self.tmpdir),
                    NUMBA_CACHE_DIR=str(self.kernels))

    def prepare(self, case: Case, disk: Path) -> None:
        (disk / "home").mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        self.tmpdir.mkdir()
        os.environ["LOCALINFER_HOME"] = str(disk / "home")  # setup_old registers in-process
        case.setup_old(disk, self.inputs)

    def temps(self, disk: Path) -> list[Path]:
        return hidden(disk) + hidden(self.tmpdir)

    def states(self, case: Case, disk: Path) -> list[str | None]:
        return [case.state(t) for t in case.targets(disk)]

    def reference(self, case: Case) -> tuple[list[str | None], list[str | None], float, int, int]:
        disk = self.disk  # one path for every run: catalogs record paths
        shutil.rmtree(disk, ignore_errors=True)
        self.prepare(case, disk)
        old, before = self.states(case, disk), used_bytes(disk)
        t0 = time.monotonic()
        proc = subprocess.Popen(case.command(self.inputs, disk), env=self.env(disk),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen, first, last = snapshot(disk), None, None
        while proc.poll() is None:  # the write window: from the first change on disk to the last
            now = snapshot(disk)
            if now != seen:
                seen, last = now, time.monotonic() - t0
                first = last if first is None else first
            time.sleep(0.002)
        took = time.monotonic() - t0
        self.window[case.name] = (first or 0.0, last or took)
        if proc.returncode != 0:
            raise SystemExit(f"{case.name}: the clean run failed:\n{proc.stderr.read()[-2000:]}")
        new = self.states(case, disk)
        grown = max(used_bytes(disk) - before, PAGE)
        shutil.rmtree(disk)
        return old, new, took, before, grown

    def run_case(self, case: Case, runs: int) -> Tally:
        self.reference(case)  # a first run warms the kernel cache: time the second
        old, new, took, old_bytes, new_bytes = self.reference(case)
        tally = Tally(case.name, problems=[], sample_errors=[])
        for i in range(runs):
            full = self.enospc and i % 2 == 1
            disk = self.disk
            shutil.rmtree(disk, ignore_errors=True)
            if full:
                size = old_bytes + int(new_bytes * self.rng.uniform(0.05, 0.9)) + 4 * PAGE
                disk.mkdir(parents=True, exist_ok=True)
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                               check=True)
            try:
                self.prepare(case, disk)
                self.one_run(case, disk, full, took, old, new, tally)
            finally:
                if full:
                    subprocess.run(["umount", str(disk)], check=True)
        return tally

    def one_run(self, case: Case, disk: Path, full: bool, took: float,
                old: list[str | None], new: list[str | None], t: Tally) -> None:
        proc = subprocess.Popen(case.command(self.inputs, disk), env=self.env(disk),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if full:
            t.enospc_runs += 1
            _, err = proc.communicate(timeout=300)
        else:
            t.kill_runs += 1
            if t.kill_runs % 2:  # anywhere in the run
                time.sleep(self.rng.uniform(0.0, took))  # (Popen.wait(timeout) is too coarse)
            else:  # inside the write: from the first change on disk, as long as the clean run's
                start, end = self.window[case.name]
                before = snapshot(disk)
                while proc.poll() is None and snapshot(disk) == before:
                    time.sleep(0.001)
                time.sleep(self.rng.uniform(0.0, end - start))
            mid = False
            if proc.poll() is None:
                mid = any(p.name.endswith(".part") for p in self.temps(disk))
                proc.send_signal(signal.SIGKILL)
            _, err = proc.communicate()
            t.killed_mid_write += mid and proc.returncode == -signal.SIGKILL
        finished = proc.returncode == 0
        for target, was, will in zip(case.targets(disk), old, new, strict=True):
            try:
                now = case.state(target)
            except Exception as exc:  # noqa: BLE001 - any failure to read is corruption
                now = f"unreadable: {type(exc).__name__}: {exc}"
            if now not in (was, will):
                t.corrupt += 1
                t.problems.append(f"{case.name}: {target.name} is {now} (old {was}, new {will})")
        temps = self.temps(disk)
        t.temps_at_death += len(temps)
        for folder in {p.parent for p in temps}:
            remove_stale_temps(folder)  # what the writer's next run does first
        left = self.temps(disk)
        t.leftovers += len(left)
        t.problems += [f"{case.name}: left {p}" for p in left]
        if full and not finished:
            t.enospc_failed += 1
            # progress bars may print before it; the error itself is the last line, alone
            lines = [ln for ln in err.splitlines() if ln.strip()]
            last = lines[-1] if lines else ""
            clear = ("Traceback" not in err and last.startswith("localinfer: error:")
                     and any(w in last.lower() for w in ("space", "free")))
            t.clear_errors += clear
            if clear and len(t.sample_errors) < 2 and last not in t.sample_errors:
                t.sample_errors.append(last)
            if not clear:
                t.problems.append(f"{case.name}: unclear full-disk error: {err[-600:]!r}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=30, help="runs per writer (half kill, half full)")
    p.add_argument("--writers", default=",".join(c.name for c in CASES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-enospc", action="store_true", help="kill runs only (no root needed)")
    p.add_argument("--json", type=Path, default=None, help="write the tallies here too")
    args = p.parse_args(argv)
    enospc = not args.no_enospc
    if enospc and os.geteuid() != 0:
        p.error("full-disk runs mount a tmpfs and need root; use --no-enospc otherwise")
    wanted = args.writers.split(",")
    cases = [c for c in CASES if c.name in wanted]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="crash-writers-") as tmp:
        runner = Runner(Path(tmp), args.seed, enospc)
        try:
            tallies = [runner.run_case(c, args.runs) for c in cases]
        finally:
            runner.close()
    print(report(tallies, time.monotonic() - t0))
    if args.json:
        args.json.write_text(json.dumps([asdict(t) for t in tallies], indent=2) + "\n")
    bad = sum(t.corrupt + t.leftovers + (t.enospc_failed - t.clear_errors) for t in tallies)
    return 1 if bad else 0


def report(tallies: list[Tally], seconds: float) -> str:
    head = (f"{'writer':<15}{'kill':>6}{'mid':>6}{'full':>6}{'ENOSPC':>8}{'clear':>7}"
            f"{'corrupt':>9}{'temps@death':>13}{'leftover':>10}")
    rows = [head]
    for t in tallies:
        rows.append(f"{t.writer:<15}{t.kill_runs:>6}{t.killed_mid_write:>6}{t.enospc_runs:>6}"
                    f"{t.enospc_failed:>8}{t.clear_errors:>7}{t.corrupt:>9}"
                    f"{t.temps_at_death:>13}{t.leftovers:>10}")
    runs = sum(t.kill_runs + t.enospc_runs for t in tallies)
    rows.append(f"{runs} runs in {seconds:.0f} s: "
                f"{sum(t.corrupt for t in tallies)} corrupt targets, "
                f"{sum(t.leftovers for t in tallies)} leftover temp files, "
                f"{sum(t.clear_errors for t in tallies)}/{sum(t.enospc_failed for t in tallies)} "
                "full-disk failures with a clear error")
    rows += [f"  {line}" for t in tallies for line in (t.problems or [])[:5]]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
