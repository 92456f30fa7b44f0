"""Small uploads (trident.runtime.uploads): queued on the stream like a kernel, never a host wait
for the device; a page-locked buffer is refilled only after the copy that read it ran."""

import pytest
import torch

import trident
from trident import torch_private
from trident.runtime.uploads import Uploads

on_gpu = pytest.mark.skipif(trident.platform.SIMULATOR, reason="page-locked uploads need the cuda backend")


@on_gpu
def test_an_upload_returns_while_the_device_is_still_busy_and_every_one_lands():
    dev = torch.device("cuda", torch.cuda.current_device())
    uploads = Uploads(pinned=True, slots=2)
    targets = [torch.zeros(3, dtype=torch.int64, device=dev) for _ in range(5)]
    torch_private.cuda_sleep(200_000_000)  # about 0.1 s of GPU clock cycles queued before the first upload
    uploads.write(targets[0], [1, 2, 3])
    queued = torch.cuda.Event()
    queued.record()
    # A plain copy from pageable memory would have returned only after the sleep: this one is still queued.
    assert not queued.query(), "the upload made the host wait for the device"
    for i in range(1, 5):  # two slots for five uploads: slot reuse waits for the copy that read it
        uploads.write(targets[i], [i, 10 * i, 100 * i])
    torch.cuda.synchronize()
    assert targets[0].tolist() == [1, 2, 3]
    assert [t.tolist() for t in targets[1:]] == [[i, 10 * i, 100 * i] for i in range(1, 5)]


def test_without_pinned_memory_an_upload_is_a_plain_copy():
    target = torch.zeros(4, dtype=torch.int64)
    assert Uploads(pinned=False).write(target, [0, 1, 2, 3]) is target
    assert target.tolist() == [0, 1, 2, 3]
