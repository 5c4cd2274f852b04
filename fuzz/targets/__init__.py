"""The fuzz targets, by name. Kept free of project imports: fuzz/engine.py imports a target only
inside atheris's import hook, so that the project's modules get instrumented.

Every target module has:

    DESCRIPTION        one line: what it feeds and which rules it checks
    setup()            -> the one-input function (bytes -> None; raises on a finding), after
                       starting whatever the target needs (the API targets start services)
    seeds()            -> inputs that reach deep at once (a valid record, a valid frame, ...)
"""

from __future__ import annotations

TARGETS: dict[str, str] = {
    "record": "fuzz.targets.record",
    "dispatch": "fuzz.targets.dispatch",
    "metafiles": "fuzz.targets.metafiles",
    "ids": "fuzz.targets.ids",
    "commitlog_api": "fuzz.targets.commitlog_api",
    "cq_api": "fuzz.targets.cq_api",
    "index_api": "fuzz.targets.index_api",
}
