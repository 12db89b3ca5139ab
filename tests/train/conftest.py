"""Training tests run on one thread: the models are small, and on a shared two-core machine
two threads per step were measured 2 to 16 times slower than one (each step waits for the
thread that was descheduled)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
