"""Test setup: eight simulated CPU devices (set before jax is imported) and shared helpers."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import ctypes  # noqa: E402
import gc  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"


def _malloc_trim():
    """Hand the C heap's free pages back to the OS (glibc only; elsewhere nothing). XLA's compile and
    run threads each keep a malloc arena, whose freed memory otherwise stays in the process."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


@pytest.fixture(autouse=True, scope="module")
def _release_memory_after_each_module():
    """After each test module (its own fixtures are torn down first): drop what it left behind, so
    the suite's memory does not grow with every module run before. JAX keeps every executable it
    compiled (hundreds of shapes and configurations over the suite, several GB); within a module
    they are reused, across modules rarely."""
    yield
    gc.collect()
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()
    gc.collect()
    _malloc_trim()


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
