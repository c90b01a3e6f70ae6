"""`python -m trnlab bench generate --quick` runs headless and writes a truthful JSON report."""

import json

import pytest

from trnlab.bench import generate as bench_generate
from trnlab.__main__ import main as cli
from trnlab.buckets import bucket_pad_tokens


def test_quick_benchmark_writes_its_report(tmp_path, capsys):
    output = tmp_path / "bench.json"
    assert cli(["bench", "generate", "--quick", "--prompts", "6", "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    settings, workload, runs, checks = report["settings"], report["workload"], report["runs"], report["checks"]
    assert settings["quick"] and settings["prompts"] == 6 and settings["backend"] == "eager"
    lengths = workload["prompt_lengths"]
    assert len(lengths) == 6 and all(4 <= n <= 24 for n in lengths)
    assert len(workload["buckets"]) <= 2 and max(workload["buckets"]) == max(lengths)
    assert workload["pad_tokens"] == bucket_pad_tokens(lengths, workload["buckets"])
    assert workload["cache_length"] == max(lengths) + 4
    assert set(runs) == {"eager_unbucketed", "eager_bucketed", "compiled_unbucketed", "compiled_bucketed",
                         "compiled_bucketed_steady"}
    assert runs["eager_unbucketed"]["graphs"] == runs["eager_bucketed"]["graphs"] == 0
    # one decode graph per new static cache length when unbucketed; one in all when bucketed
    assert runs["compiled_unbucketed"]["graphs"] == runs["compiled_unbucketed"]["distinct_shapes"] >= 1
    assert runs["compiled_bucketed"]["graphs"] == 1 and runs["compiled_bucketed_steady"]["graphs"] == 0
    assert runs["compiled_bucketed_steady"]["steady_tokens_per_second"] > 0
    assert all(len(r["requests_table"]) == 6 for r in runs.values())
    assert checks["identical_bucketed_vs_unbucketed_eager"] and checks["identical_bucketed_vs_unbucketed_compiled"]
    assert checks["identical_compiled_vs_eager"]  # backend "eager" computes exactly what eager does
    assert checks["bucketed_graphs_within_budget"] and checks["bucketed_graph_budget"] == len(workload["buckets"])
    assert checks["unbucketed_graphs_equal_distinct_shapes"]
    assert settings["neff_cache"].startswith("on, in ")  # warm by default: nothing empties it
    printed = capsys.readouterr().out
    assert "compiled_bucketed" in printed and f"wrote {output}" in printed


def test_settings_default_to_the_full_workload():
    args = bench_generate.build_parser().parse_args([])
    settings = bench_generate._settings(args)
    assert (settings["prompts"], settings["shortest"], settings["longest"]) == (64, 4, 200)
    assert settings["backend"] is None and settings["buckets"] == 4 and not settings["compile_prefill"]
    quick = bench_generate._settings(bench_generate.build_parser().parse_args(["--quick", "--backend", "aot_eager"]))
    assert quick["prompts"] == 8 and quick["backend"] == "aot_eager"


def test_backend_other_than_neuron_is_refused_on_neuron_not_replaced(fake_neuron):
    settings = bench_generate._settings(bench_generate.build_parser().parse_args(["--backend", "inductor"]))
    with pytest.raises(ValueError, match="backend 'inductor' cannot compile for a NeuronCore"):
        bench_generate.run_benchmark(settings, model=object(), tokenizer=object(), device="neuron")


def test_help_exits_cleanly(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(["bench", "generate", "--help"])
    assert exit_info.value.code == 0
    assert "--compile-prefill" in capsys.readouterr().out


def test_the_report_says_whether_the_neff_cache_is_warm_or_off(monkeypatch):
    monkeypatch.delenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", raising=False)
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", "/shared/neff")
    assert bench_generate.neff_cache_state() == "on, in /shared/neff: graphs compiled before are loaded"
    monkeypatch.setenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", "1")  # a cold run, set before the process starts
    assert bench_generate.neff_cache_state().startswith("off (TORCH_NEURONX_NEFF_DISABLE_CACHE=1)")


def test_the_harness_keeps_its_old_import_paths():
    import trnlab
    from trnlab import bench
    from trnlab.bench import timing, workload

    for name in ("sample_prompt_lengths", "corpus_prompts", "run_generation_workload", "identical_outputs",
                 "WorkloadResult", "RequestRecord"):
        assert getattr(bench, name) is getattr(workload, name)
    for name in ("time_generation", "timings_differ"):
        assert getattr(bench, name) is getattr(timing, name) is getattr(trnlab, name)
    assert trnlab.run_generation_workload is workload.run_generation_workload


def test_steady_median_is_the_median_or_none():
    from trnlab.bench.timing import steady_median

    assert steady_median([3.0, 1.0, 2.0]) == 2.0 and steady_median(iter([1.0, 2.0])) == 1.5
    assert steady_median([]) is None
