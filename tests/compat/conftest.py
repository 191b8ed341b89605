"""pytest setup for the compatibility suite: the official `queen-mq` client against a running broker.

The broker's base URL comes from the environment variable QUEEN_URL (tests/compat/main.rs sets it
to the broker it starts). Helpers shared by the test modules live in compat_helpers.py.
"""

import os

import pytest


def pytest_configure(config):
    if not os.environ.get("QUEEN_URL", "").strip():
        pytest.exit(
            "QUEEN_URL is not set: point it at a running broker, e.g. "
            "QUEEN_URL=http://127.0.0.1:6632 python -m pytest tests/compat "
            "(cargo test -p queen-broker --test compat starts one and sets it)",
            returncode=2,
        )


@pytest.fixture(scope="session")
def queen_url():
    """Base URL of the broker under test."""
    return os.environ["QUEEN_URL"].strip()
