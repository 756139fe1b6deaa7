import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_TPU_CACHE_DIR", "off")

import pytest  # noqa: E402
import torch  # noqa: E402

import deferfuse  # noqa: E402

warnings.filterwarnings("ignore", message="deferfuse: aten op")


@pytest.fixture(params=["strict", "debug", "defer_and_fuse"])
def mode(request):
    with deferfuse.mode(request.param):
        yield request.param


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
