import pytest
import torch

from trnlab.compile_tracking import CompileTracker, compile_seconds, graphs_compiled


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
