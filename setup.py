"""Package discovery: localinfer/ plus backends/, quant/ and tui/ installed as localinfer.*.

Everything else about the project is in pyproject.toml.
"""

from setuptools import find_packages, setup

MAPPED = ("backends", "quant", "tui")

packages = find_packages(include=["localinfer", "localinfer.*"])
package_dir = {"localinfer": "localinfer"}
for top in MAPPED:
    packages.append(f"localinfer.{top}")
    packages += [f"localinfer.{top}.{sub}" for sub in find_packages(top)]
    package_dir[f"localinfer.{top}"] = top

setup(packages=packages, package_dir=package_dir)
