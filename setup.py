"""Maps the two source folders onto the `sluice` namespace.

`runtime/` is imported as `sluice.runtime` and `operator/` as `sluice.operator` (never as
`operator`, which the standard library owns). pyproject.toml holds everything else.
"""

from setuptools import find_packages, setup

SOURCES = {"sluice.runtime": "runtime", "sluice.operator": "operator"}

packages = []
for name, folder in SOURCES.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=SOURCES)
