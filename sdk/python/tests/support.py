"""Shared test setup: puts this tree's src/ first on sys.path (so the tests
test this checkout, installed or not) and finds the real server to use."""

from __future__ import annotations

import os
import sys
import unittest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)


def real_server(testcase: unittest.TestCase, extra_flag: str = "") -> tuple:
    """(url, api_key) of the aenv server under test, from AENV_URL and
    AENV_API_KEY. Skips when they are unset, unless AENV_REQUIRE_ROOT_TESTS=1:
    then the test fails, so CI cannot pass by skipping. Tests behind an
    opt-in extra_flag (AENV_LIFECYCLE) skip unless it is 1."""
    if extra_flag and os.environ.get(extra_flag) != "1":
        testcase.skipTest(f"opt-in: set {extra_flag}=1")
    url, key = os.environ.get("AENV_URL"), os.environ.get("AENV_API_KEY")
    if url and key:
        return url, key
    why = "needs a real aenv server: set AENV_URL and AENV_API_KEY"
    if os.environ.get("AENV_REQUIRE_ROOT_TESTS") == "1":
        testcase.fail(why + " (AENV_REQUIRE_ROOT_TESTS=1 forbids skipping)")
    testcase.skipTest(why)
