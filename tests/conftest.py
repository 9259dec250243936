"""How ``make test`` orders its tests (``pytest -n 2 --dist loadfile``: long files first).

The xdist groups below matter only under ``--dist loadgroup``, which ``make test`` does
not use: it split the SLURM tests over both workers.

A test that uses a module-scoped fixture (a trained run, the SLURM cluster, a torchrun
job's peers) joins its module's xdist group, so the fixture is built once, on one
worker; every other test is a unit of its own, free to fill whichever worker is idle.
Units are handed out in collection order, so the long ones go first: a long test
started last would leave the other worker idle until it ends."""

import pytest

LONG_FIRST = ("slurm", "distributed", "slow")


def shares_a_module_fixture(item: pytest.Item) -> bool:
    definitions = getattr(item, "_fixtureinfo", None)
    if definitions is None:
        return False
    return any(
        definition.scope in ("module", "package", "session")
        and definition.func.__module__.startswith("tests.")  # not pytest's tmp_path_factory
        for name in item.fixturenames
        for definition in definitions.name2fixturedefs.get(name, ())
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = {}
    for item in items:
        if shares_a_module_fixture(item) or item.get_closest_marker("distributed"):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
            groups[item] = item.module.__name__

    def kind(item: pytest.Item) -> int:
        found = (i for i, name in enumerate(LONG_FIRST) if item.get_closest_marker(name))
        return next(found, len(LONG_FIRST))

    group_kind = {}
    for item, group in groups.items():
        group_kind[group] = min(group_kind.get(group, len(LONG_FIRST)), kind(item))
    # stable: a group's tests, and a file's, keep their order
    items.sort(key=lambda item: (group_kind.get(groups.get(item), kind(item)), item not in groups))
