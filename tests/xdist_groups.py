"""`--dist loadgroup` that honours `xdist_group` under pytest 9.2 (hooks, re-exported by conftest).

pytest-xdist 3.8 tells its controller a test's group by appending ``@group`` to the node ID on
the worker (``item._nodeid``). pytest 9.2 keeps node IDs structured (``item._id``) and ignores
that write (pytest-xdist#1386, open), so every group was spread over the workers: two tests
compressing the same image at once, a module's minutes-long fixture made once per worker.

Here the node IDs stay as they are. Each worker writes its grouped tests' groups into a folder
the controller named, during collection; the controller's scheduler, which splits the tests into
work units only once every worker has finished collecting, reads them there. Should a fixed
xdist append the suffix again, the map is keyed by those IDs and the answer is the same.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

_WHERE = "halo_xdist_groups"  # the key in each worker's workerinput: the folder
_FOLDER = pytest.StashKey[Path]()


def group_of(item: pytest.Item) -> str | None:
    """The work unit's name for ``item``: its groups joined as xdist joins them, or None."""
    names = {
        str(m.args[0] if m.args else m.kwargs.get("name", "default"))
        for m in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) or None


def record_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker of a loadgroup run: write {node ID: group} for the controller."""
    workerinput: dict[str, Any] = getattr(config, "workerinput", {})
    if _WHERE not in workerinput:
        return
    groups = {item.nodeid: g for item in items if (g := group_of(item))}
    out = Path(workerinput[_WHERE]) / f"{workerinput['workerid']}.json"
    out.write_text(json.dumps(groups))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    config: pytest.Config = node.config
    if config.getvalue("dist") != "loadgroup":
        return
    if _FOLDER not in config.stash:
        config.stash[_FOLDER] = Path(tempfile.mkdtemp(prefix="halo-xdist-groups-"))
    node.workerinput[_WHERE] = str(config.stash[_FOLDER])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class GroupsFromWorkers(LoadGroupScheduling):  # type: ignore[misc]
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # first called once every worker has collected
                self._groups = {}
                if (folder := config.stash.get(_FOLDER, None)) is not None:
                    for written in sorted(folder.glob("*.json")):
                        self._groups.update(json.loads(written.read_text()))
            return self._groups.get(nodeid) or super()._split_scope(nodeid)

    return GroupsFromWorkers(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    if (folder := config.stash.get(_FOLDER, None)) is not None:
        shutil.rmtree(folder, ignore_errors=True)
