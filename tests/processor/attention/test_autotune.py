"""``attention_path=auto`` by measurement: the probe times the eligible paths, keeps the fastest
per host and call shape on disk, and a later call takes it from there."""

from __future__ import annotations

import json

import pytest
import torch

from processor.attention.autotune import (
    PathChoice,
    ProbeShape,
    cache_key,
    eligible_paths,
    fastest_path,
    host_name,
    time_paths,
)
from processor.attention.native import native_available

CPU = torch.device("cpu")
SHAPE = ProbeShape(batch=1, heads=2, n_q=300, n_k=364, head_dim=16, window=32)


def test_the_probe_picks_the_fastest_of_what_it_timed_and_a_second_call_reads_the_cache(tmp_path):
    cache = tmp_path / "paths.json"
    first = fastest_path(SHAPE, CPU, cache)
    assert not first.cached
    assert set(first.seconds) == set(eligible_paths(SHAPE, CPU)) and len(first.seconds) >= 2
    assert first.path == min(first.seconds, key=first.seconds.__getitem__)
    assert all(s > 0 for s in first.seconds.values())
    saved = json.loads(cache.read_text())[cache_key(SHAPE, CPU)]
    assert saved["path"] == first.path and saved["n_q"] == 300 and saved["host"] == host_name(CPU)
    second = fastest_path(SHAPE, CPU, cache)
    assert second.cached and second.path == first.path and second.seconds == first.seconds
    assert "cached" in second.describe() and first.path in second.describe()


def test_another_shape_is_probed_anew_and_both_stay_in_the_cache(tmp_path):
    cache = tmp_path / "paths.json"
    fastest_path(SHAPE, CPU, cache)
    other = ProbeShape(batch=1, heads=2, n_q=200, n_k=200, head_dim=32, window=16, needs_grad=False)
    assert not fastest_path(other, CPU, cache).cached
    assert len(json.loads(cache.read_text())) == 2


def test_an_entry_another_run_wrote_meanwhile_is_kept(tmp_path):
    """Runs that probe at once (a sweep's members) add to the file under a lock, read anew."""
    cache = tmp_path / "paths.json"
    fastest_path(SHAPE, CPU, cache)
    written = json.loads(cache.read_text())
    cache.write_text(json.dumps(written | {"another run's key": {"path": "banded", "seconds": {}}}))
    fastest_path(ProbeShape(1, 2, 200, 200, 32, 16, needs_grad=False), CPU, cache)
    assert "another run's key" in json.loads(cache.read_text()) and len(json.loads(cache.read_text())) == 3


def test_an_unreadable_cache_is_measured_again_and_replaced(tmp_path):
    cache = tmp_path / "paths.json"
    cache.write_text("{not json")
    choice = fastest_path(SHAPE, CPU, cache)
    assert not choice.cached
    assert json.loads(cache.read_text())[cache_key(SHAPE, CPU)]["path"] == choice.path


def test_a_cached_path_this_host_can_no_longer_run_is_measured_again(tmp_path):
    cache = tmp_path / "paths.json"
    cache.write_text(json.dumps({cache_key(SHAPE, CPU): {"path": "flash_attn", "seconds": {}}}))
    choice = fastest_path(SHAPE, CPU, cache)
    assert not choice.cached and choice.path in eligible_paths(SHAPE, CPU)


@pytest.mark.parametrize("window", [None, 100, 99])
def test_a_window_that_holds_every_key_times_the_native_kernel_against_dense(tmp_path, window):
    cache = tmp_path / "paths.json"
    whole = ProbeShape(batch=1, heads=2, n_q=100, n_k=100, head_dim=16, window=window)
    choice = fastest_path(whole, CPU, cache)
    if not native_available():
        assert choice.path == "dense" and not choice.seconds and "only path" in choice.describe()
        return
    assert set(choice.seconds) == {"native", "dense"} and choice.path == min(choice.seconds, key=choice.seconds.get)
    assert cache.exists()


def test_a_window_that_holds_every_key_has_one_path_without_the_native_kernel(tmp_path, monkeypatch):
    from processor.attention import dispatch

    monkeypatch.setattr(dispatch, "native_available", lambda: False)
    cache = tmp_path / "paths.json"
    choice = fastest_path(ProbeShape(batch=1, heads=2, n_q=100, n_k=100, head_dim=16, window=None), CPU, cache)
    assert choice.path == "dense" and not choice.seconds and not cache.exists()
    assert "only path" in choice.describe()


def test_the_candidates_are_the_cpu_paths_that_can_run_the_call():
    fp32 = eligible_paths(SHAPE, CPU)
    assert set(fp32) <= {"native", "banded", "sdpa_blocks"} and "sdpa_blocks" in fp32 and "banded" in fp32
    assert ("native" in fp32) == native_available()
    bf16 = eligible_paths(ProbeShape(1, 2, 300, 364, 16, 32, dtype="bfloat16"), CPU)
    assert "banded" not in bf16  # fp32/fp64 only


def test_the_timings_are_of_each_path_forward_and_backward():
    seconds = time_paths(SHAPE, ["sdpa_blocks", "banded"], CPU, rounds=1)
    assert set(seconds) == {"sdpa_blocks", "banded"} and all(s > 0 for s in seconds.values())


def test_a_path_that_fails_on_the_probe_is_left_out_and_named(tmp_path):
    """A path that raises on the probe's call (out of memory, a compiler error; here a path
    that does not exist) gets ``inf``, is never picked, and the log line says it failed."""
    seconds = time_paths(SHAPE, ["sdpa_blocks", "no_such_path"], CPU, rounds=1)
    assert seconds["no_such_path"] == float("inf") and 0 < seconds["sdpa_blocks"] < float("inf")
    line = PathChoice(min(seconds, key=seconds.__getitem__), seconds, host="here").describe()
    assert "picked sdpa_blocks" in line and "no_such_path failed" in line


def test_a_shape_with_fewer_keys_than_queries_is_refused():
    with pytest.raises(ValueError, match="fewer keys than queries"):
        ProbeShape(batch=1, heads=2, n_q=100, n_k=50, head_dim=16, window=8)


def test_the_key_names_the_host_torch_the_threads_and_the_call():
    assert cache_key(SHAPE, CPU) == cache_key(ProbeShape(1, 2, 300, 364, 16, 32), CPU)
    assert cache_key(SHAPE, CPU) != cache_key(ProbeShape(1, 2, 300, 364, 16, 64), CPU)
    threads, key = torch.get_num_threads(), cache_key(SHAPE, CPU)
    try:
        torch.set_num_threads(threads + 1)
        assert cache_key(SHAPE, CPU) != key  # a pick timed on one thread is not one for two
    finally:
        torch.set_num_threads(threads)
    assert torch.backends.cpu.get_cpu_capability() in host_name(CPU)
