"""Suite-wide fixtures: the signal-handler guard, and the franky-sim server shared by the robot and
calibration tests, and how the suite is split between pytest-xdist workers.

A test must not leave process-wide signal handlers changed: a changed SIGINT handler is inherited
(when ignored) by every process a later test starts, and the Ctrl-C test then sees a child that
cannot be interrupted. The guard restores the handler after each test and warns with the name of
the test that changed it.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import signal
import threading
import warnings

import pytest

GUARDED = (signal.SIGINT, signal.SIGTERM)
AT_START = {sig: signal.getsignal(sig) for sig in GUARDED}  # before any test or fixture ran


@pytest.fixture(autouse=True)
def restore_signal_handlers(request):
    """After each test, puts back the handlers the suite started with (a change made by a
    module-scoped fixture is caught at the first test that uses it)."""
    yield
    for sig, handler in AT_START.items():
        now = signal.getsignal(sig)
        if now is not handler:
            signal.signal(sig, handler)
            warnings.warn(f"after {request.node.nodeid} (or a fixture torn down before it) the "
                          f"{signal.Signals(sig).name} handler was {now!r}; restored", RuntimeWarning, stacklevel=1)


FRANKY_SIM_FOLDERS = ("tests/robot/", "tests/calibration/")  # every test of the franky-sim server is here
FRANKY_SIM_SCOPE = "franky_sim"


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: only called where it is installed
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` (what ``scripts/run_tests.sh`` asks for) sends each module whole to one
    worker, so that its fixtures (a Ray session, a trained run the module compares against) are
    built once. Here the franky-sim folders count as one module, run first: franky-sim steps its
    physics in real time, and starved of CPU by a busy neighbour its simulation goes unstable (NaN
    accelerations, then the server exits). So they run at a raised priority (``pytest_runtest_setup``)
    with the other modules beside them or, where this user may not raise a priority, alone."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

        def _franky_sim_node(self):
            """The worker running the franky-sim tests while any is left, else None."""
            for node, work in self.assigned_work.items():
                if not all(work.get(FRANKY_SIM_SCOPE, {}).values()):
                    return node
            return None

        def _assign_work_unit(self, node) -> None:
            busy = None if may_raise_priority() else self._franky_sim_node()
            if busy is None or busy is node:  # that worker takes its next module while finishing them
                super()._assign_work_unit(node)

        def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
            running = self._franky_sim_node() is not None
            super().mark_test_complete(node, item_index, duration)
            if running and self._franky_sim_node() is None:  # the last one ended: wake the idle workers
                for other in list(self.assigned_work):
                    if other is not node:
                        self._reschedule(other)

    config.option.loadscopereorder = False  # the workers' order (below) is kept
    return ModuleScheduling(config, log)


NICE_AT_START = os.getpriority(os.PRIO_PROCESS, 0)
FRANKY_SIM_RAISE = 10
"""How far the franky-sim tests' nice value is lowered: weighted about 9 to 1 against a neighbour
running at the suite's own (measured: their 6.3 minutes unchanged beside a busy worker)."""


@functools.cache
def may_raise_priority() -> bool:
    """Whether this process may lower its nice value (root, CAP_SYS_NICE), tried on a throwaway
    thread: on Linux a nice value belongs to a thread, so the others are left as they were."""
    allowed = []

    def attempt():
        try:
            os.setpriority(os.PRIO_PROCESS, 0, NICE_AT_START - FRANKY_SIM_RAISE)
            allowed.append(True)
        except OSError:
            allowed.append(False)

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join()
    return allowed[0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The franky-sim tests run at a raised priority where it may be raised, and every other test at
    the suite's own. It is the thread running the tests that is changed: the franky-sim server, the
    robot's control threads and every process a robot test starts inherit it from there."""
    franky_sim_scope = _scope(item.nodeid) == FRANKY_SIM_SCOPE
    nice = NICE_AT_START - FRANKY_SIM_RAISE if franky_sim_scope and may_raise_priority() else NICE_AT_START
    if os.getpriority(os.PRIO_PROCESS, 0) != nice:
        os.setpriority(os.PRIO_PROCESS, 0, nice)  # back up needs no privilege; down was allowed above


def _scope(nodeid: str) -> str:
    module = nodeid.split("::")[0]
    return FRANKY_SIM_SCOPE if module.startswith(FRANKY_SIM_FOLDERS) else module


def _franky_sim_then_longest_first(items):
    """A worker's collection order is the order modules are handed out in (``ModuleScheduling``
    keeps it): the franky-sim tests first (their 6 minutes are the longest scope), then the longest
    module first (a slow-marked test counted as 30 s, any other as 1 s), so that no long module
    starts last and leaves one worker running it alone."""
    scope = {item.nodeid: _scope(item.nodeid) for item in items}
    weight = collections.Counter()
    for item in items:
        weight[scope[item.nodeid]] += 30 if item.get_closest_marker("slow") else 1
    # stable: a module's own order is kept
    items.sort(key=lambda item: (scope[item.nodeid] != FRANKY_SIM_SCOPE, -weight[scope[item.nodeid]]))


_franky_sim = contextlib.ExitStack()
_last_franky_sim_user: str | None = None


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(config, items):
    global _last_franky_sim_user
    if hasattr(config, "workerinput"):  # an xdist worker: its order is the order work is handed out in
        _franky_sim_then_longest_first(items)
    users = [item.nodeid for item in items if "franky_sim" in getattr(item, "fixturenames", ())]
    elsewhere = [u for u in users if not u.startswith(FRANKY_SIM_FOLDERS)]
    if elsewhere:  # the scheduler above would start a second server on another worker
        raise pytest.UsageError(f"{elsewhere[0]} uses the franky_sim fixture outside {FRANKY_SIM_FOLDERS}")
    _last_franky_sim_user = users[-1] if users else None


@pytest.hookimpl(trylast=True)  # after the item's fixtures (e.g. a module's ROS graph on the server) are torn down
def pytest_runtest_teardown(item, nextitem):
    if item.nodeid == _last_franky_sim_user:
        _franky_sim.close()  # idle, the server takes a quarter core for the rest of the suite


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test of the franky-sim server shows the end of the server's log in its report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and "franky_sim" in getattr(item, "fixturenames", ()):
        from franky_sim_server import SERVERS, server_log_tail

        for host in SERVERS:
            report.sections.append((f"franky-sim {host}: the end of its log", server_log_tail(host)))


@pytest.fixture(scope="session")
def franky_sim(tmp_path_factory):
    """One franky-sim server for the robot and calibration tests; yields its address. Stopped
    after the last test that uses it. Skips where its venv is missing (``tests/franky_sim_server.py``)."""
    from franky_sim_server import franky_sim_executable, running_server

    exe = franky_sim_executable()
    if not exe.exists():
        pytest.skip(f"franky-sim is not installed ({exe} is missing): bash scripts/setup.sh maniskill,libero,dev,robot "
                    f"makes it")
    yield _franky_sim.enter_context(running_server(tmp_path_factory.mktemp("franky-sim")))
    _franky_sim.close()


@pytest.fixture(autouse=True)
def ordinary_scheduling():
    """Put the test thread back on ordinary scheduling after each test: franky raises a thread that
    talks to a robot to SCHED_FIFO 99 when it may (as root), and processes later tests start would
    inherit it (busy nodes at realtime priority starve a 2-core machine)."""
    yield
    if hasattr(os, "sched_getscheduler") and os.sched_getscheduler(0) != os.SCHED_OTHER:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
