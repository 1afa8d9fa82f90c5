"""atomic_file's temp-file rule with real processes: a SIGKILLed writer's temp goes in the next
write's sweep, a live writer's never does, and a full disk (a real tmpfs) is one clear error
that leaves the old file (RELIABILITY.md #31)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localinfer.atomic_file import atomic_write, remove_stale_temps, temp_dir, temp_path

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from localinfer.atomic_file import atomic_write, temp_dir
    where = Path(sys.argv[2])
    if sys.argv[1] == "file":
        with atomic_write(where) as f:
            f.write(b"half" * 1000)
            f.flush()
            print("ready", flush=True)
            time.sleep(60)
    else:
        with temp_dir(where, "out") as d:
            (d / "inside").write_bytes(b"x" * 1000)
            print("ready", flush=True)
            time.sleep(60)
""")


def _holder(kind: str, where: Path) -> subprocess.Popen[str]:
    """A writer stopped half-way inside atomic_write / temp_dir (it waits to be killed)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, kind, str(where)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


def test_live_writer_kept_killed_writer_swept_by_next_write(tmp_path: Path) -> None:
    target = tmp_path / "model.gguf"
    target.write_bytes(b"old complete file")
    proc = _holder("file", target)
    try:
        [name] = _temps(tmp_path)
        assert f".{proc.pid}." in name
        assert remove_stale_temps(tmp_path) == 0  # alive and locked: not ours to remove
        assert _temps(tmp_path) == [name]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert target.read_bytes() == b"old complete file"
    with atomic_write(target) as f:  # the next run of any writer in this folder
        f.write(b"new")
    assert target.read_bytes() == b"new"
    assert _temps(tmp_path) == []


def test_unreaped_zombie_counts_as_dead(tmp_path: Path) -> None:
    proc = _holder("file", tmp_path / "chat.json")
    proc.send_signal(signal.SIGKILL)
    try:
        for _ in range(200):  # until the kernel has made it a zombie (its lock gone)
            if Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                break
            time.sleep(0.01)
        assert remove_stale_temps(tmp_path) == 1
        assert _temps(tmp_path) == []
    finally:
        proc.wait()


def test_killed_temp_dir_swept_by_next_one(tmp_path: Path) -> None:
    proc = _holder("dir", tmp_path)
    [name] = _temps(tmp_path)
    assert remove_stale_temps(tmp_path) == 0
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with temp_dir(tmp_path, "out") as d:
        assert _temps(tmp_path) == [d.name] != [name]
    assert _temps(tmp_path) == []


def test_pid_and_age_rules(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    mine = temp_path(tmp_path / "a")  # this live process's pid, unlocked: a reused pid
    mine.write_bytes(b"")
    gone = tmp_path / f".b.{dead.pid}.0123abcd.part"
    gone.write_bytes(b"")
    fresh_legacy = tmp_path / ".c.k3j_9x2a.part"  # an older version's name: no pid
    fresh_legacy.write_bytes(b"")
    old_legacy = tmp_path / ".d.q8w_1zzz.part"
    old_legacy.write_bytes(b"")
    os.utime(old_legacy, (0, 0))
    not_ours = [tmp_path / "visible.part", tmp_path / ".another-app's download.part"]
    for p in not_ours:
        p.write_bytes(b"")
        os.utime(p, (0, 0))
    assert remove_stale_temps(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [mine.name, fresh_legacy.name, *(p.name for p in not_ours)])


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (root only, as in CI)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_full_disk_is_one_clear_error_and_keeps_the_old_file(small_disk: Path) -> None:
    target = small_disk / "conv.json"
    target.write_bytes(b'{"old": true}')
    with pytest.raises(OSError) as err, atomic_write(target) as f:
        for _ in range(100):
            f.write(b"x" * 10_000)
    assert err.value.errno == errno.ENOSPC
    message = str(err.value)
    assert "No space left on device writing" in message and str(target) in message
    assert "\n" not in message
    assert target.read_bytes() == b'{"old": true}'
    assert [p.name for p in small_disk.iterdir()] == ["conv.json"]
