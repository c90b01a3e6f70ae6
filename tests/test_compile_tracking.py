import types

import pytest
import torch

from trnlab.compile_tracking import CompileTracker, _counters


def test_tracker_counts_one_graph_per_new_static_shape():
    torch._dynamo.reset()
    double = torch.compile(lambda x: (x * 2).sin(), backend="aot_eager", dynamic=False)
    with CompileTracker() as tracker:
        for n in [3, 4, 3, 3, 5, 3]:
            with tracker.call(f"n={n}"):
                double(torch.randn(n))
    assert tracker.graphs == 3
    assert [c.new_graphs for c in tracker.calls] == [1, 1, 0, 0, 1, 0]
    assert tracker.compile_seconds > 0
    summary = tracker.summary()
    assert summary["steady_seconds"] is not None and summary["steady_seconds"] < summary["first_call_seconds"]
    assert str(tracker).startswith("3 graph(s) compiled")
    # frozen at exit: later compilations do not count
    double(torch.randn(7))
    graphs, seconds, _ = _counters()
    assert tracker.graphs == 3 and graphs >= 4 and seconds > 0


def test_tracker_without_calls_or_compilation():
    with CompileTracker() as tracker:
        torch.ones(2) + 1
    assert tracker.graphs == 0 and tracker.compile_seconds == pytest.approx(0.0)
    assert str(tracker) == "0 graph(s) compiled, 0.00 s compiling"
    assert tracker.summary()["steady_seconds"] is None


def test_calls_record_compile_seconds_and_running_totals():
    torch._dynamo.reset()
    square = torch.compile(lambda x: x * x + 1, backend="eager", dynamic=False)
    with CompileTracker() as tracker:
        for n in [2, 2, 3]:
            with tracker.call():
                square(torch.ones(n))
    seconds = [c.compile_seconds for c in tracker.calls]
    assert seconds[0] > 0 and seconds[1] == 0 and seconds[2] > 0
    assert sum(seconds) <= tracker.compile_seconds + 1e-9


def test_tracker_reports_when_dynamo_gives_up_recompiling():
    torch._dynamo.reset()
    cube = torch.compile(lambda x: x ** 3, backend="eager", dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=2), CompileTracker() as tracker:
        for n in range(1, 6):
            with tracker.call(f"n={n}"):
                assert torch.equal(cube(torch.full((n,), 2.0)), torch.full((n,), 8.0))  # still right, eagerly
    assert tracker.graphs == 2 and [c.new_graphs for c in tracker.calls] == [1, 1, 0, 0, 0]
    assert tracker.recompile_limit_hits == 1 and _counters()[2] >= 1
    assert "recompile limit 1 time(s)" in str(tracker)
    with CompileTracker() as quiet:
        pass
    assert quiet.recompile_limit_hits == 0 and "recompile limit" not in str(quiet)


def test_a_tracker_refuses_to_nest_in_itself_and_to_be_read_before_its_block():
    torch._dynamo.reset()
    f = torch.compile(lambda x: x + 1, backend="eager", dynamic=False)
    tracker = CompileTracker()
    for read in (lambda: tracker.graphs, lambda: tracker.compile_seconds, lambda: tracker.recompile_limit_hits,
                 lambda: tracker.summary(), lambda: str(tracker)):
        with pytest.raises(RuntimeError, match="read before the tracker's with block"):
            read()
    with pytest.raises(RuntimeError, match=r"only inside the tracker's with block"):
        with tracker.call():
            pass
    with tracker:
        f(torch.ones(2))
        with pytest.raises(RuntimeError, match="already inside its with block.*second CompileTracker"):
            with tracker:
                pass
        with CompileTracker() as inner:  # a different tracker nests freely
            f(torch.ones(3))
            f(torch.ones(4))
    assert (tracker.graphs, inner.graphs) == (3, 2)
    with pytest.raises(RuntimeError, match="only inside"):
        with tracker.call():
            pass


def test_a_tracker_entered_again_measures_only_its_new_block():
    torch._dynamo.reset()
    f = torch.compile(lambda x: x - 1, backend="eager", dynamic=False)
    tracker = CompileTracker()
    with tracker:
        with tracker.call("first"):
            f(torch.ones(2))
    assert tracker.graphs == 1 and len(tracker.calls) == 1
    with tracker:
        for n in (3, 4, 3):
            with tracker.call(f"n={n}"):
                f(torch.ones(n))
        assert tracker.graphs == 2  # read inside the block: the first block's end counts are gone
    assert tracker.graphs == 2
    assert [c.label for c in tracker.calls] == ["n=3", "n=4", "n=3"] and [c.new_graphs for c in tracker.calls] == [1, 1, 0]


def test_forget_compiled_graphs_drops_the_graphs_and_the_model_s_cache_length():
    import trnlab

    torch._dynamo.reset()
    f = torch.compile(lambda x: x * 3, backend="eager", dynamic=False)
    f(torch.ones(2))
    model = types.SimpleNamespace(_previous_max_cache_length=12)
    trnlab.forget_compiled_graphs(model)
    assert "_previous_max_cache_length" not in vars(model)
    with CompileTracker() as tracker:
        f(torch.ones(2))  # compiled again: the reset dropped it
    assert tracker.graphs == 1


def test_recompile_log_collects_why_a_graph_recompiled():
    import trnlab
    from trnlab import _compat

    torch._dynamo.reset()
    f = torch.compile(lambda x: x.cos(), backend="eager", dynamic=False)
    torch._logging.set_logs(recompiles=True)
    try:
        with trnlab.recompile_log() as log:
            f(torch.ones(2))
            f(torch.ones(5))
    finally:
        torch._logging.set_logs()
    assert len(log) == 1 and log[0].startswith("Recompiling function")
    assert "size mismatch at index 0. expected 2, actual 5" in log[0]
    assert _compat.dynamo_recompiles_logger().propagate  # restored
    with pytest.warns(UserWarning, match=r"recompile log is off.*set_logs\(recompiles=True\)"):
        with trnlab.recompile_log() as quiet:
            f(torch.ones(7))
    assert quiet == []


def test_recompile_log_hides_machine_paths():
    from trnlab.compile_tracking import _shorten_paths

    text = "Recompiling function f in /home/me/.venv/lib/python3.11/site-packages/transformers/x.py:121"
    assert _shorten_paths(text) == "Recompiling function f in <site-packages>/transformers/x.py:121"


def test_summary_is_a_dict_and_str_the_line():
    torch._dynamo.reset()
    triple = torch.compile(lambda x: x * 3, backend="eager", dynamic=False)
    with CompileTracker() as tracker:
        for n in [2, 2]:
            with tracker.call():
                triple(torch.ones(n))
    summary = tracker.summary()
    assert isinstance(summary, dict) and summary["graphs"] == 1 and summary["calls"] == 2
    assert summary["steady_calls"] == 1 and summary["steady_seconds"] == tracker.calls[1].seconds
    assert type(summary) is dict and str(tracker).startswith("1 graph(s) compiled")
    assert "steady state" in str(tracker)


def test_steady_median_is_the_median_or_none():
    from trnlab.compile_tracking import _steady_median

    assert _steady_median([3.0, 1.0, 2.0]) == 2.0 and _steady_median(iter([1.0, 2.0])) == 1.5
    assert _steady_median([]) is None
