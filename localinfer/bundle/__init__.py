"""Offline bundles: a folder (or zip/tar) that installs and runs a model with no network.

    manifest.json        every file's size and sha256, targets, models, licences, demo tokens
    run.sh, run.ps1      launchers: first run makes a venv from wheels/ offline (launchers.py)
    check.py             the standard-library file check the launchers run first (check.py)
    README.txt           for whoever receives the bundle
    models/*.gguf        stored uncompressed, used in place
    wheels/TARGET/       one wheelhouse per platform and Python, with requirements.lock

create.py builds one, verify.py and install.py read one (a folder, or an archive through
archive.py's safe extraction). Nothing in a bundle is ever unpickled, and no Numba kernel
cache travels in one: the target compiles its own.
"""
