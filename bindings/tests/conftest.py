import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_TPU_CACHE_DIR", "off")

import deferfuse  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

warnings.filterwarnings("ignore", message="deferfuse: aten op")


@pytest.fixture(params=["strict", "debug", "defer_and_fuse"])
def mode(request):
    with deferfuse.mode(request.param):
        yield request.param


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(params=["strict", "defer_and_fuse"])
def nan_mode(request):
    """The modes without Debug's NaN/Inf check (tests that make NaN or Inf on purpose)."""
    with deferfuse.mode(request.param):
        yield request.param


@pytest.fixture
def no_fallback():
    """Fails the test if any aten op ran through the CPU fallback."""
    before = deferfuse.fallback_counts()
    yield
    used = deferfuse.fallback_counts() - before
    assert not used, f"fell back to the CPU: {dict(used)}"
