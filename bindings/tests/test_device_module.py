"""`torch.tpu` and `torch.accelerator` on the `tpu` device: streams and
events over the engine's one order, memory figures from the C++ allocator."""

import deferfuse
import pytest
import torch


def test_accelerator_is_tpu():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.accelerator.device_count() == torch.tpu.device_count() == 1


def test_streams_are_distinct_objects_with_the_current_one_switchable():
    s = torch.tpu.Stream(priority=-1)
    assert isinstance(s, torch.Stream) and s.device.type == "tpu"
    default = torch.tpu.current_stream()
    assert s.stream_id != default.stream_id
    with torch.tpu.stream(s):
        assert torch.tpu.current_stream().stream_id == s.stream_id
        assert torch.accelerator.current_stream().stream_id == s.stream_id
    assert torch.tpu.current_stream().stream_id == default.stream_id


def test_work_on_two_streams_is_ordered_by_wait_stream(mode):
    a, b = torch.tpu.Stream(), torch.tpu.Stream()
    x = torch.zeros(1000, device="tpu")
    with torch.tpu.stream(a):
        x.add_(1.0)
    b.wait_stream(a)
    with torch.tpu.stream(b):
        y = x * 2.0
    b.synchronize()
    assert y.sum().item() == 2000.0


def test_event_record_wait_query_and_synchronize(mode):
    s = torch.tpu.Stream()
    e = torch.tpu.Event()
    x = torch.ones(64, device="tpu") * 3.0
    e.record()
    s.wait_event(e)
    assert e.query()
    e.synchronize()
    assert x.sum().item() == 192.0


def test_elapsed_time_between_timing_events_is_non_negative():
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    x = torch.randn(128, 128, device="tpu")
    (x @ x).sum()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0


def test_elapsed_time_needs_timing_events():
    a, b = torch.tpu.Event(), torch.tpu.Event()
    a.record()
    b.record()
    with pytest.raises(ValueError, match="enable_timing"):
        a.elapsed_time(b)


def test_synchronize_runs_pending_work():
    with deferfuse.mode("defer_and_fuse"):
        x = torch.ones(8, device="tpu") + 1.0
        torch.tpu.synchronize()
        torch.accelerator.synchronize()
        assert x.sum().item() == 16.0


def test_memory_figures_follow_storages():
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    x = torch.empty(256, 256, device="tpu")
    assert torch.tpu.memory_allocated() == before + 256 * 256 * 4
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated()
    assert torch.tpu.max_memory_allocated() >= before + 256 * 256 * 4
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    del x
    assert torch.tpu.memory_allocated() == before
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    torch.tpu.empty_cache()


def test_device_names_and_properties():
    assert torch.tpu.get_device_name() == "deferfuse"
    assert torch.tpu.get_device_properties(0).total_memory > 0
    with pytest.raises(ValueError, match="one device"):
        torch.tpu.get_device_name("tpu:3")


def test_seeding_api_round_trips(no_fallback):
    torch.tpu.manual_seed(123)
    assert torch.tpu.initial_seed() == 123
    state = torch.tpu.get_rng_state()
    a = torch.rand(16, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    b = torch.rand(16, device="tpu").cpu()
    assert torch.equal(a, b)
    torch.manual_seed(7)
    assert torch.tpu.initial_seed() == 7


def test_untyped_storage_on_tpu_uses_the_device_allocator():
    s = torch.UntypedStorage(40, device="tpu")
    assert s.nbytes() == 40 and s.device.type == "tpu"


def test_non_blocking_copies_both_ways(mode):
    x = torch.randn(4, 6, device="tpu")
    c = x.to("cpu", non_blocking=True)
    torch.tpu.synchronize()
    assert c.is_pinned()
    torch.testing.assert_close(c, x.cpu())
    back = c.to("tpu", non_blocking=True)
    torch.testing.assert_close(back.cpu(), c)


def test_pinned_host_memory():
    p = torch.empty(16).pin_memory()
    assert p.is_pinned() and p[3:].is_pinned()
    assert not torch.empty(16).is_pinned()
    assert torch.empty(4, pin_memory=True).is_pinned()
    data = torch.utils.data.TensorDataset(torch.arange(8.0))
    (batch,) = next(iter(torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)))
    assert batch.is_pinned()
