"""SGLang hands ``--log-level`` to uvicorn verbatim.

Defect (sglang 0.5.17, still present in 0.5.23): ``ServerArgs.log_level`` and
``log_level_http`` are free strings. SGLang's own logger accepts ``WARN`` (it does
``getattr(logging, level.upper())``), but ``http_server.launch_server`` passes the same
string to ``uvicorn.run``/``uvicorn.Config``, whose ``LOG_LEVELS`` only has lower-case
names and ``warning`` (no ``warn``/``fatal``).

Symptom: ``--log-level WARN`` (or ``Engine(log_level="WARN")``) raises ``KeyError`` in
uvicorn's ``configure_logging`` before the socket binds; the scheduler comes up and
idles, the port never listens, ``/health`` is unreachable.

Fix: normalise both levels at the top of ``ServerArgs.__post_init__`` (lower-case;
``warn`` -> ``warning``, ``fatal`` -> ``critical``), before anything reads them.

Upstream: sgl-project/sglang issue #30353; PRs #30357 and #30560 add the same
normalisation as ``ServerArgs._handle_log_level``. Once a release carries that handler
(or lower-cases the level itself) this patch reports ``fixed-upstream`` and stops.
"""

from halo.patching import Edit, Marker, Patch

FILE = "sglang/srt/server_args.py"

ANCHOR = """        self._resolved_overrides = []

        self._handle_return_hidden_states_mode()
"""

FIX = """        self._resolved_overrides = []

        # halo patch sglang-uvicorn-log-level: uvicorn knows only lower-case level names
        # and "warning"/"critical", while SGLang's own logger also takes WARN or FATAL.
        for _halo_attr in ("log_level", "log_level_http"):
            _halo_level = getattr(self, _halo_attr)
            if isinstance(_halo_level, str):
                _halo_level = _halo_level.strip().lower()
                _halo_level = {"warn": "warning", "fatal": "critical"}.get(_halo_level, _halo_level)
                setattr(self, _halo_attr, _halo_level)

        self._handle_return_hidden_states_mode()
"""

PATCH = Patch(
    name="sglang-uvicorn-log-level",
    distribution="sglang",
    versions=">=0.5.17",
    summary="normalise --log-level/--log-level-http before uvicorn sees them (WARN crashes it)",
    edits=(Edit(file=FILE, defect=ANCHOR, fix=FIX),),
    fixed_upstream=(
        Marker(file=FILE, pattern=r"def _handle_log_level\("),
        Marker(
            file=FILE, pattern=r"self\.log_level(_http)?\s*=\s*self\.log_level(_http)?\.lower\(\)"
        ),
    ),
)
