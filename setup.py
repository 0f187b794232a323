"""Maps the two source trees onto the `sluice` namespace (a src layout).

`runtime/src/sluice/runtime` is imported as `sluice.runtime` and
`operator/src/sluice/operator` as `sluice.operator`. No folder at the repository root is
itself an importable package, so an interpreter started there never finds a local
`operator` package in place of the standard library's. pyproject.toml holds everything else.
"""

from setuptools import find_packages, setup

SOURCES = {"sluice.runtime": "runtime/src/sluice/runtime", "sluice.operator": "operator/src/sluice/operator"}

packages = []
for name, folder in SOURCES.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=SOURCES)
