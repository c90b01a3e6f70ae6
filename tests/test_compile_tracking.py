import pytest
import torch

from trnlab.compile_tracking import CompileTracker, compile_seconds, graphs_compiled, recompile_limit_hits


def test_tracker_counts_one_graph_per_new_static_shape():
    torch._dynamo.reset()
    double = torch.compile(lambda x: (x * 2).sin(), backend="aot_eager", dynamic=False)
    with CompileTracker() as tracker:
        for n in [3, 4, 3, 3, 5, 3]:
            with tracker.call(f"n={n}"):
                double(torch.randn(n))
    assert tracker.graphs == 3
    assert [c.new_graphs for c in tracker.calls] == [1, 1, 0, 0, 1, 0]
    assert [r["graphs_so_far"] for r in tracker.table()] == [1, 2, 2, 2, 3, 3]
    assert tracker.compile_seconds > 0
    assert tracker.steady_seconds is not None and tracker.steady_seconds < tracker.first_call_seconds
    assert tracker.summary().startswith("3 graph(s) compiled")
    # frozen at exit: later compilations do not count
    double(torch.randn(7))
    assert tracker.graphs == 3 and graphs_compiled() >= 4 and compile_seconds() > 0


def test_tracker_without_calls_or_compilation():
    with CompileTracker() as tracker:
        torch.ones(2) + 1
    assert tracker.graphs == 0 and tracker.compile_seconds == pytest.approx(0.0)
    assert tracker.summary() == "0 graph(s) compiled, 0.00 s compiling"
    assert tracker.steady_seconds is None and tracker.neuron_graphs is None


def test_calls_record_compile_seconds_and_running_totals():
    torch._dynamo.reset()
    square = torch.compile(lambda x: x * x + 1, backend="eager", dynamic=False)
    with CompileTracker() as tracker:
        for n in [2, 2, 3]:
            with tracker.call():
                square(torch.ones(n))
    seconds = [c.compile_seconds for c in tracker.calls]
    assert seconds[0] > 0 and seconds[1] == 0 and seconds[2] > 0
    rows = tracker.table()
    assert rows[-1]["compile_seconds_so_far"] == pytest.approx(sum(seconds))
    assert sum(seconds) <= tracker.compile_seconds + 1e-9


def test_tracker_reports_when_dynamo_gives_up_recompiling():
    torch._dynamo.reset()
    cube = torch.compile(lambda x: x ** 3, backend="eager", dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=2), CompileTracker() as tracker:
        for n in range(1, 6):
            with tracker.call(f"n={n}"):
                assert torch.equal(cube(torch.full((n,), 2.0)), torch.full((n,), 8.0))  # still right, eagerly
    assert tracker.graphs == 2 and [c.new_graphs for c in tracker.calls] == [1, 1, 0, 0, 0]
    assert tracker.recompile_limit_hits == 1 and recompile_limit_hits() >= 1
    assert "recompile limit 1 time(s)" in tracker.summary()
    with CompileTracker() as quiet:
        pass
    assert quiet.recompile_limit_hits == 0 and "recompile limit" not in quiet.summary()


def test_fresh_neff_cache_points_neuron_at_an_empty_folder_and_restores(monkeypatch):
    import os

    import trnlab

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", "/tmp/neff_cache")
    with trnlab.fresh_neff_cache() as folder:
        assert os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] == folder and os.listdir(folder) == []
        open(os.path.join(folder, "graph.neff"), "w").close()
    assert os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] == "/tmp/neff_cache" and not os.path.exists(folder)
    monkeypatch.delenv("TORCH_NEURONX_NEFF_CACHE_DIR")
    with trnlab.fresh_neff_cache(enabled=False) as nothing:
        assert nothing is None and "TORCH_NEURONX_NEFF_CACHE_DIR" not in os.environ
