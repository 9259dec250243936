"""How ``make test`` orders its tests (``pytest -n 2 --dist loadfile``: long files first).

The xdist groups below matter only under ``--dist loadgroup``, which ``make test`` does
not use: it split the SLURM tests over both workers.

A test that uses a module-scoped fixture (a trained run, the SLURM cluster, a torchrun
job's peers) joins its module's xdist group, so the fixture is built once, on one
worker; every other test is a unit of its own, free to fill whichever worker is idle.
Units are handed out in collection order, so the long ones go first: a long test
started last would leave the other worker idle until it ends."""

import itertools
import os
import sys

import pytest

from tests import leaks

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


def pytest_configure(config: pytest.Config) -> None:
    # the controller's pid: xdist's workers and everything the tests start inherit it
    os.environ.setdefault(leaks.SESSION_MARK, str(os.getpid()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = (yield).get_result()
    setattr(item, f"report_{report.when}", report)  # the guard below reads the call's


TESTS = itertools.count()


@pytest.fixture(autouse=True)
def ends_what_it_started(request):
    """Every process the test started is ended with it (tests/leaks.py); a test that
    passed yet left one running fails. Autouse: set up before the test's other function
    fixtures, after the module's (whose processes, and what they start, stay for the
    module's next tests)."""
    before = leaks.owned(None)
    mark = f"{os.getpid()}-{next(TESTS)}"
    os.environ[leaks.TEST_MARK] = mark
    yield
    del os.environ[leaks.TEST_MARK]
    before |= leaks.KEPT
    left = {pid for pid in leaks.owned(mark) - before if leaks.started_by_the_test(pid, before)}
    killed = leaks.end(left, leaks.GRACE)
    report = getattr(request.node, "report_call", None)
    if killed and report is not None and report.passed:
        pytest.fail(
            f"the test left {len(killed)} processes running; killed:\n{leaks.describe(killed)}",
            pytrace=False,
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus):
    yield  # after xdist has ended its workers and the modules their fixtures
    if os.environ.get(leaks.SESSION_MARK) != str(os.getpid()):
        return  # an xdist worker: the controller checks once every worker is gone
    session_pids = leaks.marked(leaks.SESSION_MARK, str(os.getpid())) - {os.getpid()}
    left = {pid for pid in session_pids if not leaks.helper(pid)}
    killed = leaks.end(left, leaks.GRACE)
    if killed:
        print(
            f"\nthe suite left {len(killed)} processes running; killed:\n{leaks.describe(killed)}",
            file=sys.stderr,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
