"""`python -m trnlab bench generate --quick` runs headless and writes a truthful JSON report."""

import json

import pytest

from trnlab import bench
from trnlab.__main__ import main as cli
from trnlab.generation import bucket_pad_tokens


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
    args = bench._generate_args([])
    assert (args.prompts, args.shortest, args.longest) == (64, 4, 200)
    assert args.backend is None and args.buckets == 4 and not args.compile_prefill
    quick = bench._generate_args(["--quick", "--backend", "aot_eager"])
    assert quick.prompts == 8 and quick.backend == "aot_eager"


def test_backend_other_than_neuron_is_refused_on_neuron_not_replaced(fake_neuron):
    args = bench._generate_args(["--backend", "inductor", "--device", "neuron"])
    with pytest.raises(ValueError, match="backend 'inductor' cannot compile for a NeuronCore"):
        bench._run_generate(args, model=object(), tokenizer=object())


def test_help_exits_cleanly(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(["bench", "generate", "--help"])
    assert exit_info.value.code == 0
    assert "--compile-prefill" in capsys.readouterr().out


def test_the_report_says_whether_the_neff_cache_is_warm_or_off(monkeypatch):
    monkeypatch.delenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", raising=False)
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", "/shared/neff")
    assert bench._neff_cache_state() == "on, in /shared/neff: graphs compiled before are loaded"
    monkeypatch.setenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", "1")  # a cold run, set before the process starts
    assert bench._neff_cache_state().startswith("off (TORCH_NEURONX_NEFF_DISABLE_CACHE=1)")
