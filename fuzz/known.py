"""Findings already reported, by signature (fuzz/findings.py), with the strict xfail test that
reproduces each. `python -m fuzz` marks them "known" and fails only on new ones; the short forms
in tests/fuzz/ step over them. When a fix lands, its xfail test starts passing (strict: the
suite fails) and its lines here go.

Untyped exceptions are named by the innermost project function: under Python 3.11 a list
comprehension is its own frame ("<listcomp>").
"""

from __future__ import annotations

_TESTS = "tests/fuzz/test_known_findings.py::"

KNOWN: dict[str, str] = {}
