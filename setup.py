"""Maps the repository's top-level folders onto the single `corral` import namespace.

The layout is fixed by the design (libs/, contracts/, services/ at the top); every import name
lives under `corral.`. setuptools' package_dir does the mapping for both `pip install .` and
`pip install -e .` (PEP 660 editable installs honour package_dir through a meta-path finder).
Folders of data files (migrations/, schemas/) are listed as namespace packages too: setuptools
warns, once per build step, about data folders that are importable but not listed.
"""

from setuptools import find_namespace_packages, setup

ROOTS = {
    "corral": "libs/corral",
    "corral.contracts": "contracts",
    "corral.services": "services",
}


def _packages() -> list[str]:
    found: list[str] = []
    for name, path in ROOTS.items():
        found.append(name)
        found.extend(f"{name}.{sub}" for sub in find_namespace_packages(path, exclude=["*__pycache__*"]))
    return found


setup(
    package_dir=ROOTS,
    packages=_packages(),
    package_data={
        "corral": ["py.typed"],
        "corral.eventstore": ["migrations/*.sql"],
        "corral.contracts": ["schemas/*.json"],
    },
    include_package_data=True,
)
