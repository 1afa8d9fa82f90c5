"""`localinfer bundle` end to end with the real SmolLM2: a bundle made for this machine, unpacked
in an empty folder inside a network namespace with no network at all, and run through its
launcher (a fresh venv from the wheelhouse alone, kernels compiled on the target, the recorded
tokens printed); verify catching damage; install; a create killed half-way; an aarch64 bundle.

The network namespace needs CAP_SYS_ADMIN (root, as in CI): without it the offline tests skip,
unless LOCALINFER_REQUIRE_NETNS=1 (set by .ci/run) makes that a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
PROMPT = "Name a colour."


def _li(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "localinfer", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"localinfer {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc


def _netns_ok() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


def _require_netns() -> None:
    if not _netns_ok():
        if os.environ.get("LOCALINFER_REQUIRE_NETNS"):
            pytest.fail("`unshare -n` is not permitted here, but LOCALINFER_REQUIRE_NETNS is set")
        pytest.skip("creating a network namespace (unshare -n) needs CAP_SYS_ADMIN")


def _offline(script: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """`script` under sh in a new network namespace (only a down loopback), with a bare
    environment: the target's python3 on PATH and nothing of this venv."""
    base_python = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    env = {"PATH": f"{base_python.parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
           "LANG": "C.UTF-8"}
    return subprocess.run(["unshare", "-n", "sh", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def bundle_tar(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real bundle for this machine: SmolLM2 and the default extras, as a tar archive."""
    out = tmp_path_factory.mktemp("made") / "demo"
    _li("bundle", "create", str(out), "--model", MODEL, "--archive", "tar")
    tar = out.with_name("demo.tar")
    assert tar.is_file() and not out.exists()
    return tar


@pytest.fixture(scope="module")
def bundle_dir(bundle_tar: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = Path(_li("bundle", "extract", str(bundle_tar),
                    str(tmp_path_factory.mktemp("x") / "out")).stdout.strip())
    assert (root / "manifest.json").is_file()
    return root


def _manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def test_bundle_runs_offline_in_an_empty_folder(bundle_tar: Path, tmp_path: Path) -> None:
    """Unpacked with tar in an empty folder with no network: the launcher makes a venv from the
    wheelhouse alone, compiles the kernels on the target, and answers with the recorded tokens;
    a second run reuses the venv."""
    _require_netns()
    (tmp_path / "home").mkdir()
    (tmp_path / "empty").mkdir()
    script = f"""set -e
        if python3 -c "import socket; socket.create_connection(('pypi.org', 443), timeout=3)" 2>/dev/null
        then echo "the namespace has a network" >&2; exit 99; fi
        tar xf {bundle_tar}
        cd demo
        # -t 0: the demo prompts were recorded greedy; run samples by default
        ./run.sh run "{PROMPT}" -n 32 -t 0 > ../first.out
        echo ===second >&2
        ./run.sh run "{PROMPT}" -n 32 -t 0 > ../second.out
        echo "{PROMPT}" | ./run.sh > ../chat.out
        echo ===moved >&2
        cp -a ../demo ../moved
        cd ../moved
        ./run.sh run "{PROMPT}" -n 32 -t 0 > ../moved.out
    """
    proc = _offline(script, tmp_path / "empty", tmp_path / "home")
    assert proc.returncode == 0, proc.stderr[-4000:]
    root = tmp_path / "empty" / "demo"
    want = _manifest(root)["prompts"][0]
    assert want["prompt"] == PROMPT and len(want["token_ids"]) > 0
    first, second = proc.stderr.split("===second")
    second, moved = second.split("===moved")
    assert "first run: making a Python environment" in first
    assert "compiling the kernels for this CPU" in first  # nothing compiled was shipped
    assert "tokens match the recorded ones" in first  # the launcher's smoke run
    assert "first run" not in second and "compiling" not in second
    assert (tmp_path / "empty" / "first.out").read_text() == want["text"] + "\n"
    assert (tmp_path / "empty" / "second.out").read_text() == want["text"] + "\n"
    # a copy elsewhere (a bundle zipped after use): its .runtime is not used, but made again
    assert "was made on another machine or in another folder: starting over" in moved
    assert "compiling the kernels for this CPU" in moved
    assert (tmp_path / "empty" / "moved.out").read_text() == want["text"] + "\n"
    # no arguments: the chat (its line REPL, stdout not being a terminal) on the bundled model
    assert len((tmp_path / "empty" / "chat.out").read_text().strip()) > 10
    runtime = root / ".runtime"
    venvs = list(runtime.glob("venv-*/.complete"))
    assert len(venvs) == 1
    assert list((runtime / "home" / "numba").rglob("*.nbi"))  # compiled here, on the target
    # and the venv's localinfer is the bundle's wheel, not this checkout
    site = next(runtime.glob("venv-*/lib/python*/site-packages"))
    assert (site / "localinfer" / "bundle" / "check.py").is_file()


def test_bundle_holds_no_compiled_or_pickled_state(bundle_dir: Path) -> None:
    names = [p.name for p in bundle_dir.rglob("*")]
    assert not [n for n in names if n.endswith((".nbi", ".nbc", ".pkl", ".pyc"))]
    m = _manifest(bundle_dir)
    assert m["models"][0]["name"] == MODEL and m["models"][0]["license"] == "apache-2.0"
    assert set(m["files"]) == {p.relative_to(bundle_dir).as_posix()
                               for p in bundle_dir.rglob("*") if p.is_file()} - {"manifest.json"}
    lock = next(bundle_dir.glob("wheels/*/requirements.lock")).read_text()
    assert "localinfer[server,tui]==" in lock and "--hash=sha256:" in lock
    gguf = bundle_dir / m["models"][0]["file"]
    assert gguf.stat().st_size == m["files"][m["models"][0]["file"]]["size"]


def _copy(root: Path, dest: Path) -> Path:
    shutil.copytree(root, dest, copy_function=os.link)  # hard links: cheap; replace to damage
    return dest


def test_verify_catches_damage_and_smoke_passes(bundle_dir: Path, bundle_tar: Path,
                                                tmp_path: Path) -> None:
    ok = _li("bundle", "verify", str(bundle_dir), "--smoke")
    assert "tokens match the recorded ones" in ok.stderr and "ok" in ok.stdout
    assert _li("bundle", "verify", str(bundle_tar)).returncode == 0  # an archive, unextracted

    m = _manifest(bundle_dir)
    gguf_rel = m["models"][0]["file"]
    flipped = _copy(bundle_dir, tmp_path / "flipped")
    data = bytearray((flipped / gguf_rel).read_bytes())
    data[len(data) // 2] ^= 0x01
    (flipped / gguf_rel).unlink()
    (flipped / gguf_rel).write_bytes(data)
    r = _li("bundle", "verify", str(flipped), check=False)
    assert r.returncode == 1 and f"checksum mismatch: {gguf_rel}" in r.stderr

    missing = _copy(bundle_dir, tmp_path / "missing")
    wheel = next(missing.glob("wheels/*/numpy-*.whl"))
    wheel.unlink()
    r = _li("bundle", "verify", str(missing), check=False)
    assert r.returncode == 1 and f"missing file: {wheel.relative_to(missing).as_posix()}" \
        in r.stderr

    extra = _copy(bundle_dir, tmp_path / "extra")
    (extra / "models" / "notes.txt").write_text("hello")
    r = _li("bundle", "verify", str(extra), check=False)
    assert r.returncode == 1 and "unexpected file: models/notes.txt" in r.stderr
    # install refuses a damaged bundle and places nothing
    env = {**os.environ, "LOCALINFER_HOME": str(tmp_path / "home")}
    r = _li("bundle", "install", str(flipped), env=env, check=False)
    assert r.returncode == 1 and "damaged" in r.stderr
    assert not (tmp_path / "home" / "models").exists()


def test_install_puts_the_models_in_the_cache(bundle_tar: Path, tmp_path: Path) -> None:
    """From the archive into an empty home: `localinfer run smollm2-135m` then needs no pull
    (run in a namespace with no network where the kernel allows it)."""
    home = tmp_path / "home"
    env = {**os.environ, "LOCALINFER_HOME": str(home)}
    _li("bundle", "install", str(bundle_tar), env=env)
    placed = home / "models" / MODEL
    assert [p.name for p in placed.iterdir()] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    listing = _li("list", env=env).stdout
    assert any(line.startswith(MODEL) and " yes " in line for line in listing.splitlines())
    cmd = [sys.executable, "-m", "localinfer", "run", "--model", MODEL, PROMPT, "-n", "8"]
    if _netns_ok():
        cmd = ["unshare", "-n", *cmd]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr[-2000:]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("when", ["wheels", "archive"])
def test_killed_create_leaves_nothing(smollm2_path: Path, tmp_path: Path, when: str) -> None:
    """kill -9 while the wheelhouse fills, or while the archive is written: no bundle, no
    partial folder, no temp file (the janitor removes them)."""
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "localinfer", "bundle", "create",
                             str(out / "demo"), "--model", MODEL, "--archive", "zip",
                             "--extras", ""], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            names = _leftovers(out)
            partial = [out / n for n in names if n.endswith(".part") and (out / n).is_dir()]
            if when == "wheels" and partial and list(partial[0].glob("wheels/*/*.whl")):
                break
            if when == "archive" and any(n.endswith(".part") for n in names):
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"create finished before the kill point ({when})"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    for _ in range(100):
        if not _leftovers(out):
            break
        time.sleep(0.1)
    assert _leftovers(out) == []


def test_aarch64_bundle_from_a_path_model(smollm2_path: Path, tmp_path: Path) -> None:
    """A bundle for linux-aarch64 made on this x86 machine holds aarch64 wheels of numpy, numba
    and llvmlite (none of this machine's), passes verify, and its model — given by path —
    installs into the user's catalog under the file's name."""
    model = tmp_path / "tiny-chat.gguf"
    os.link(smollm2_path, model) if smollm2_path.stat().st_dev == tmp_path.stat().st_dev \
        else shutil.copyfile(smollm2_path, model)
    out = tmp_path / "arm"
    _li("bundle", "create", str(out), "--model", str(model), "--platform", "linux-aarch64",
        "--extras", "", "--python", "3.11")
    wheels = [p.name for p in (out / "wheels" / "linux-aarch64-cp311").glob("*.whl")]
    for pkg in ("numpy", "numba", "llvmlite"):
        assert any(w.startswith(f"{pkg}-") and "aarch64" in w for w in wheels), (pkg, wheels)
    assert not [w for w in wheels if "x86_64" in w]
    assert _li("bundle", "verify", str(out)).returncode == 0
    home = tmp_path / "home"
    env = {**os.environ, "LOCALINFER_HOME": str(home)}
    _li("bundle", "install", str(out), env=env)
    assert (home / "models" / "tiny-chat" / "tiny-chat.gguf").is_file()
    assert '[models."tiny-chat"]' in (home / "user-models.toml").read_text()
