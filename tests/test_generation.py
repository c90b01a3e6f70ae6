"""Generation helpers: prompts in one form, padding, device moves, compile config, shape bucketing,
the bucket chooser and the workload harness."""

import itertools
import os
import random
import types
import warnings

import pytest
import torch
from fake_neuron import ReportingDevice

import trnlab
from trnlab import compile_tracking as ct, generation as gen

# ----------------------------------------------------------------------------- bucket chooser


def brute_force_waste(lengths, k):
    """Least padding over every set of at most k buckets that holds every length."""
    longest = max(lengths)
    candidates = sorted(set(lengths) - {longest})
    best = None
    for size in range(0, k):
        for extra in itertools.combinations(candidates, size):
            waste = gen.bucket_pad_tokens(lengths, (*extra, longest))
            best = waste if best is None else min(best, waste)
    return best


def test_choose_buckets_matches_brute_force_on_small_inputs():
    rng = random.Random(0)
    for _ in range(300):
        lengths = [rng.randint(1, 30) for _ in range(rng.randint(1, 9))]
        k = rng.randint(1, 5)
        buckets = trnlab.choose_buckets(lengths, k)
        assert len(buckets) <= k and max(buckets) == max(lengths) and list(buckets) == sorted(set(buckets))
        assert set(buckets) <= set(lengths)
        assert gen.bucket_pad_tokens(lengths, buckets) == brute_force_waste(lengths, k), (lengths, k, buckets)


def test_choose_buckets_known_answers():
    assert trnlab.choose_buckets([10, 10, 11, 50, 52], 2) == (11, 52)
    assert trnlab.choose_buckets([3, 1, 2], 1) == (3,)
    assert gen.bucket_pad_tokens([3, 1, 2], (3,)) == 3
    # as many buckets as distinct lengths: every length is its own bucket, nothing wasted
    assert trnlab.choose_buckets([5, 3, 5, 9], 3) == (3, 5, 9)
    assert trnlab.choose_buckets([5, 3, 5, 9], 10) == (3, 5, 9)
    assert gen.bucket_pad_tokens([5, 3, 5, 9], (3, 5, 9)) == 0


def test_waste_falls_as_the_budget_grows():
    lengths = ct.sample_prompt_lengths(64, 4, 200, seed=0)
    rows = trnlab.padding_by_bucket_count(lengths, 8)
    wastes = [r["pad_tokens"] for r in rows]
    assert wastes == sorted(wastes, reverse=True) and wastes[0] > wastes[-1] > 0
    assert [r["k"] for r in rows] == list(range(1, 9))
    assert all(len(r["buckets"]) == r["k"] for r in rows)
    assert 0 < rows[-1]["padding_waste"] < rows[0]["padding_waste"] < 1


@pytest.mark.parametrize("k", [0, -2, 1.5, "4", True, None])
def test_choose_buckets_rejects_a_bad_budget(k):
    with pytest.raises(ValueError, match="positive integer"):
        trnlab.choose_buckets([4, 8], k)


def test_choose_buckets_rejects_bad_lengths():
    with pytest.raises(ValueError, match="prompt lengths is empty"):
        trnlab.choose_buckets([], 2)
    with pytest.raises(ValueError, match="positive integers"):
        trnlab.choose_buckets([4, 0, 8], 2)
    with pytest.raises(ValueError, match="positive integers"):
        trnlab.choose_buckets([4, -3], 2)
    with pytest.raises(ValueError, match="positive integers"):
        trnlab.choose_buckets([4, 2.5], 2)


def test_bucket_for_and_padding_waste():
    assert [gen._bucket_for(n, (8, 16, 32)) for n in (1, 8, 9, 16, 17, 32)] == [8, 8, 16, 16, 32, 32]
    assert gen.bucket_pad_tokens([1, 8, 9, 32], (32, 8, 16)) == 7 + 0 + 7 + 0
    with pytest.raises(gen.SettingError, match="longer than the longest bucket .32.*truncate=True"):
        gen._bucket_for(33, (8, 16, 32))
    with pytest.raises(gen.SettingError):
        gen.bucket_pad_tokens([4, 40], (8, 32))
    assert issubclass(gen.SettingError, ValueError)


def test_shape_buckets_normalise_and_validate():
    buckets = trnlab.ShapeBuckets([64, 16, 32, 16], max_new_tokens=8)
    assert buckets.lengths == (16, 32, 64) and buckets.longest == 64 and buckets.cache_length == 72
    assert buckets.bucket_for(17) == 32
    with pytest.raises(TypeError, match="sequence of bucket lengths"):
        trnlab.ShapeBuckets(64, 8)
    with pytest.raises(ValueError, match=r"buckets is empty: pass at least one bucket length .*choose_buckets"):
        trnlab.ShapeBuckets((), 8)
    with pytest.raises(ValueError, match="positive integers"):
        trnlab.ShapeBuckets((0, 8), 8)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        trnlab.ShapeBuckets((8,), 0)
    fake_model = types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=64))
    trnlab.ShapeBuckets((32, 56), 8).check_model(fake_model)  # 64 positions: fits exactly
    with pytest.raises(ValueError, match="max_position_embeddings=64: lower the longest bucket"):
        trnlab.ShapeBuckets((32, 60), 8).check_model(fake_model)


def test_pad_token_lists_pads_left_or_right():
    batch = gen._pad_token_lists([[5, 6], [8]], 0, "left", length=4)
    assert batch["input_ids"].tolist() == [[0, 0, 5, 6], [0, 0, 0, 8]]
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1], [0, 0, 0, 1]]
    assert gen._pad_token_lists([[5, 6], [8]], 0, "right")["input_ids"].tolist() == [[5, 6], [8, 0]]
    with pytest.raises(ValueError, match="no pad token id: set tokenizer.pad_token"):
        gen._pad_token_lists([[5, 6]], None)


def test_sample_prompt_lengths_are_seeded_and_in_range():
    lengths = ct.sample_prompt_lengths(64, 4, 200, seed=0)
    assert lengths == ct.sample_prompt_lengths(64, 4, 200, seed=0) != ct.sample_prompt_lengths(64, 4, 200, seed=1)
    assert len(lengths) == 64 and 4 <= min(lengths) and max(lengths) <= 200 and len(set(lengths)) > 40
    with pytest.raises(ValueError, match="shortest <= longest"):
        ct.sample_prompt_lengths(4, 10, 5)


# ----------------------------------------------------------------------------- compile config


def test_compile_config_turns_on_cpu_compilation_like_neuron():
    config = trnlab.generation_compile_config("cpu")
    assert (config.backend, config.dynamic, config.mode) == ("eager", False, "default")
    assert config._compile_all_devices is True
    assert "_compile_all_devices" not in config.to_dict()  # a flag for generate, not torch.compile
    assert trnlab.generation_compile_config(torch.device("cpu"), backend="aot_eager").backend == "aot_eager"


def test_compile_config_leaves_neuron_to_transformers_and_refuses_other_backends_there(fake_neuron):
    assert trnlab.generation_compile_config("neuron") is None
    assert trnlab.generation_compile_config("neuron:0", backend="neuron") is None
    with pytest.raises(ValueError, match="backend 'inductor' cannot compile for a NeuronCore: on Neuron use "
                                         "backend='neuron'"):
        trnlab.generation_compile_config("neuron", backend="inductor")


def test_compile_backend_is_decided_in_one_place():
    # Off Neuron the course counts graphs with dynamo's "eager" backend, on CPU and GPUs alike.
    assert trnlab.compile_backend("cpu") == "eager"
    assert trnlab.compile_backend("cuda:0") == "eager"
    assert trnlab.compile_backend(torch.device("cuda", 1)) == "eager"
    assert trnlab.compile_backend("cpu", "inductor") == "inductor"
    assert trnlab.compile_backend("cuda", "aot_eager") == "aot_eager"
    assert trnlab.compile_backend("neuron") == "neuron"
    assert trnlab.compile_backend("neuron:1", "neuron") == "neuron"
    with pytest.raises(ValueError, match="backend 'eager' cannot compile for a NeuronCore"):
        trnlab.compile_backend("neuron", "eager")


# ----------------------------------------------------------------------------- with the course model


@pytest.fixture(scope="module")
def model():
    return trnlab.load_model(device="cpu")


@pytest.fixture(scope="module")
def tokenizer():
    return trnlab.load_tokenizer()


def test_forward_inputs_are_fixed_size_slices_and_output_stays_on_the_inputs_device(model, tokenizer):
    inputs = tokenizer(trnlab.EXAMPLE_PROMPT, return_tensors="pt")
    length = inputs["input_ids"].shape[1]
    with gen.record_forward_inputs(model) as calls:
        output = model.generate(**inputs, do_sample=False, max_new_tokens=6, cache_implementation="static")
    assert output.device == inputs["input_ids"].device and output.shape == (1, length + 6)
    assert len(calls) == 6  # one prefill, then one forward per further token
    assert calls[0]["input_ids"].shape == (1, length)
    assert all(c["input_ids"].shape == (1, 1) for c in calls[1:])
    masks = {c["attention_mask"]["full_attention"].shape for c in calls[1:]}
    assert masks == {(1, 1, 1, length + 5)}  # the static cache length: the same every step
    assert calls[1]["cache"] == "StaticCache on cpu"
    assert gen.moved_to_model_device(calls, "cpu") == []
    assert gen.moved_to_model_device(calls, "meta") == ["attention_mask['full_attention']", "input_ids",
                                                        "position_ids"]
    assert "forward 1 (decode 1): input_ids: cpu (1, 1)" in gen.format_forward_calls(calls)
    model.generate(**inputs, do_sample=False, max_new_tokens=2)
    assert len(calls) == 6  # the hook is gone after the block


def test_left_padded_batch_gives_each_prompt_its_own_answer(model, tokenizer):
    prompts = [trnlab.EXAMPLE_PROMPT, "Every Friday in Munich, the brewer walks to the market, where the German Beer Law says"]
    batch = gen.tokenize_batch(tokenizer, prompts, "left")
    assert batch["attention_mask"][0, 0] == 0 and batch["attention_mask"][1].all()
    assert gen.show_padding(tokenizer, batch).splitlines()[0].startswith("mask 000")
    assert tokenizer.padding_side == "left"
    together = gen.generate_batch(model, tokenizer, prompts, do_sample=False, max_new_tokens=8)
    alone = [gen.generate_batch(model, tokenizer, [p], do_sample=False, max_new_tokens=8)[0] for p in prompts]
    assert together == alone
    assert together[0].startswith(" that a traditional baguette")
    right = gen.tokenize_batch(tokenizer, prompts, "right")
    assert right["attention_mask"][0, -1] == 0 and tokenizer.padding_side == "left"
    with pytest.raises(ValueError, match="'left' or 'right'"):
        gen.tokenize_batch(tokenizer, prompts, "middle")


def test_corpus_prompts_have_the_exact_lengths(tokenizer):
    prompts = ct.corpus_prompts(tokenizer, [4, 200, 57], seed=3)
    assert [len(p) for p in prompts] == [4, 200, 57]
    assert all(isinstance(i, int) for p in prompts for i in p)
    assert prompts == ct.corpus_prompts(tokenizer, [4, 200, 57], seed=3)
    assert prompts != ct.corpus_prompts(tokenizer, [4, 200, 57], seed=4)


STATIC_NOTICE = ("generate() with a static cache will not compile on cpu: Transformers auto-compiles only on cuda, "
                 "xpu, neuron or tpu; pass compile_config=trnlab.generation_compile_config(model.device) to compile "
                 "here (or disable_compile=True to run eagerly without this warning)")


def test_will_auto_compile_answers_as_generate_compiles(model, tokenizer, monkeypatch):
    inputs = tokenizer(trnlab.EXAMPLE_PROMPT, return_tensors="pt")
    everywhere = trnlab.generation_compile_config("cpu")
    for kwargs in ({}, {"compile_config": everywhere}):
        trnlab.forget_compiled_graphs(model)
        with trnlab.CompileTracker() as tracker:
            model.generate(**inputs, do_sample=False, max_new_tokens=3, cache_implementation="static", **kwargs)
        assert gen._will_auto_compile(model, cache_implementation="static", **kwargs) is (tracker.graphs > 0), kwargs
    trnlab.forget_compiled_graphs(model)
    assert tracker.graphs > 0  # the last one, with the compile config, compiled
    assert not gen._will_auto_compile(model, cache_implementation="static", compile_config=everywhere, disable_compile=True)
    assert not gen._will_auto_compile(model, compile_config=everywhere)  # a dynamic cache is never compiled
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)  # generate() set it, compiling
    assert gen._will_auto_compile(model, cache_implementation="static", compile_config=everywhere)
    assert "TOKENIZERS_PARALLELISM" not in os.environ  # asking does not set it


def test_a_static_cache_that_will_not_compile_here_says_so(model, tokenizer, fake_neuron):
    assert gen._static_cache_notice(model, cache_implementation="static") == STATIC_NOTICE
    for quiet in ({"compile_config": trnlab.generation_compile_config("cpu")}, {"disable_compile": True}, {}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            gen.generate_batch(model, tokenizer, ["Hi"], do_sample=False, max_new_tokens=1,
                               **({"cache_implementation": "static"} if quiet else {}), **quiet)
    with pytest.warns(UserWarning) as caught:
        gen.generate_batch(model, tokenizer, ["Hi"], do_sample=False, max_new_tokens=1, cache_implementation="static")
    assert [str(w.message) for w in caught if w.category is UserWarning] == [STATIC_NOTICE]
    with ReportingDevice(model, "neuron:0"):  # Transformers compiles there by itself: nothing to say
        assert gen._will_auto_compile(model, cache_implementation="static")
        assert gen._static_cache_notice(model, cache_implementation="static") is None


def test_bucketed_generate_equals_plain_generate_token_for_token(model, tokenizer):
    buckets = trnlab.ShapeBuckets((8, 24, 40), max_new_tokens=10)
    for ids in ct.corpus_prompts(tokenizer, [3, 8, 9, 24, 31, 40], seed=1):
        prompt = torch.tensor([ids])
        plain = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                               max_new_tokens=10, cache_implementation="static", disable_compile=True)
        bucketed = gen.bucketed_generate(model, [ids], buckets=buckets, compile=False)
        assert torch.equal(plain, bucketed), prompt.shape
    # a padded batch: bucketing adds columns on the left and removes them again
    texts = [trnlab.EXAMPLE_PROMPT, "In Kyoto, the tea grower sells"]
    batch = gen.tokenize_batch(tokenizer, texts)
    plain = model.generate(**batch, do_sample=False, max_new_tokens=10, cache_implementation="static")
    assert torch.equal(plain, gen.bucketed_generate(model, texts, tokenizer=tokenizer, buckets=buckets, compile=False))


def test_bucketed_generate_refuses_or_truncates_a_too_long_prompt(model, tokenizer):
    buckets = trnlab.ShapeBuckets((8, 16), max_new_tokens=4)
    prompt = torch.tensor(ct.corpus_prompts(tokenizer, [20], seed=2))
    with pytest.raises(gen.SettingError, match="20 tokens is longer than the longest bucket .16."):
        gen.bucketed_generate(model, prompt.tolist(), buckets=buckets, compile=False)
    with pytest.warns(UserWarning, match="truncated to its last 16 tokens"):
        cut = gen.bucketed_generate(model, prompt.tolist(), buckets=buckets, compile=False, truncate=True)
    plain = model.generate(input_ids=prompt[:, -16:], attention_mask=torch.ones(1, 16, dtype=torch.long),
                           do_sample=False, max_new_tokens=4, cache_implementation="static")
    assert torch.equal(cut, plain)
    with pytest.raises(ValueError, match="max_new_tokens=5 does not fit"):
        gen.bucketed_generate(model, prompt[:, :8].tolist(), buckets=buckets, max_new_tokens=5, compile=False)
    with pytest.raises(ValueError, match="sets max_cache_len itself"):
        gen.bucketed_generate(model, prompt[:, :8].tolist(), buckets=buckets, max_cache_len=99, compile=False)
    with pytest.raises(ValueError, match="max_position_embeddings=512"):
        gen.bucketed_generate(model, prompt.tolist(), buckets=trnlab.ShapeBuckets((500,), 20), compile=False)


def test_compiled_workloads_count_one_graph_per_shape_and_bucketing_bounds_them(tokenizer):
    # eager attention: its mask is always a tensor, so a full bucket and a padded one share a graph
    model = trnlab.load_model(device="cpu", attn_implementation="eager")
    prompts = ct.corpus_prompts(tokenizer, [6, 3, 9], seed=4)
    trnlab.forget_compiled_graphs(model)
    naive = trnlab.run_generation_workload(model, prompts, 3, backend="eager")
    # decode graphs only; the static cache keeps the longest length seen: 6+2, then 8 again, then 9+2
    assert [r.cache_length for r in naive.requests] == [8, 8, 11]
    assert [r.new_graphs for r in naive.requests] == [1, 0, 1]
    assert naive.graphs == naive.distinct_shapes == 2
    assert naive.table()[-1]["graphs_so_far"] == 2 and naive.table()[-1]["shapes_so_far"] == 2
    trnlab.forget_compiled_graphs(model)
    capped = trnlab.run_generation_workload(model, prompts, 3, backend="eager", recompile_limit=1)
    # a lowered limit (notebook 03): one graph, then dynamo stops compiling and the 11-long cache runs eagerly
    assert capped.graphs == 1 < capped.distinct_shapes == 2 and capped.summary()["recompile_limit_hits"] == 1
    assert ct.identical_outputs(capped, naive)

    buckets = trnlab.ShapeBuckets((6, 12), max_new_tokens=3)
    prompts += ct.corpus_prompts(tokenizer, [12, 5], seed=5)
    trnlab.forget_compiled_graphs(model)
    eager = trnlab.run_generation_workload(model, prompts, 3, compile=False)
    trnlab.forget_compiled_graphs(model)
    bucketed = trnlab.run_generation_workload(model, prompts, 3, buckets=buckets, backend="eager",
                                           compile_prefill=True, recompile_limit=64)
    # prefill shapes 6 and 12 (12 both padded and full), one decode shape: 3 graphs, no more
    assert [r.padded_length for r in bucketed.requests] == [6, 6, 12, 12, 6]
    assert [r.new_graphs for r in bucketed.requests] == [2, 0, 1, 0, 0]
    assert bucketed.graphs == bucketed.distinct_shapes == 3 <= len(buckets.lengths) + 1
    assert ct.identical_outputs(eager, bucketed)
    assert bucketed.tokens_per_second() > 0 and bucketed.summary()["pad_tokens"] == 0 + 3 + 3 + 0 + 1
    assert ct.identical_outputs(eager, naive) is False  # different prompt lists: the check can fail
    figures = bucketed.summary()
    assert [figures[k] for k in ("label", "requests", "graphs", "distinct_shapes", "pad_tokens")] == [
        "bucketed", 5, 3, 3, 7]


def test_time_generation_reports_first_and_steady_calls(model, tokenizer):
    inputs = tokenizer(trnlab.EXAMPLE_PROMPT, return_tensors="pt")
    row = trnlab.time_generation(model, inputs, repeats=3, label="eager", do_sample=False, max_new_tokens=4,
                              cache_implementation="static", disable_compile=True)
    assert row["graphs"] == 0 and row["new_tokens"] == 4 and row["label"] == "eager"
    assert row["first_call_seconds"] > 0 and row["steady_tokens_per_second"] > 0
    assert len(row["steady_call_seconds"]) == 2 and row["steady_seconds"] == pytest.approx(
        sorted(row["steady_call_seconds"])[0] / 2 + sorted(row["steady_call_seconds"])[1] / 2)


def test_timings_differ_only_beyond_the_spread():
    assert ct.timings_differ([0.10, 0.12, 0.11], [0.20, 0.25]) is True
    assert ct.timings_differ([0.30, 0.31], [0.10, 0.12]) is True
    assert ct.timings_differ([0.10, 0.21], [0.20, 0.25]) is False  # overlapping: noise
    with pytest.raises(ValueError, match="at least one time on each side"):
        ct.timings_differ([], [0.1])


def test_plots_draw_what_they_are_given():
    import matplotlib

    matplotlib.use("Agg")
    from trnlab import plots

    rows = [{"graphs_so_far": g, "shapes_so_far": s, "compile_seconds_so_far": t}
            for g, s, t in [(1, 1, 0.5), (2, 3, 1.0), (2, 4, 1.0)]]
    fig = plots.plot_compile_growth({"unbucketed": rows, "bucketed": rows[:2]}, title="t")
    graphs_ax, seconds_ax = fig.axes
    assert len(graphs_ax.lines) == 4 and len(seconds_ax.lines) == 2
    assert list(graphs_ax.lines[1].get_ydata()) == [1, 3, 4]  # the distinct-shapes line
    fig = plots.plot_padding_waste(trnlab.padding_by_bucket_count([4, 8, 30, 31], 3))
    assert list(fig.axes[0].lines[0].get_xdata()) == [1, 2, 3]


# ----------------------------------------------------------------------------- one prompt form


def test_prompts_take_two_forms_text_or_token_id_lists(tokenizer):
    one = tokenizer(trnlab.EXAMPLE_PROMPT)["input_ids"]
    assert gen._prompt_token_ids([trnlab.EXAMPLE_PROMPT, "Bread"], tokenizer)[0] == one  # strings
    assert gen._prompt_token_ids([one, one[:2]]) == [one, one[:2]]           # id lists
    import numpy as np

    assert gen._prompt_token_ids([[np.int64(5), np.int64(7)]]) == [[5, 7]]  # numpy ids
    for other in (one, torch.tensor([one]), [torch.tensor(one)]):  # a bare id list, tensors: not a form
        with pytest.raises(TypeError, match=r"a list of strings or a list of token-id lists \(e.g. \[\[9707, 11\]\]\)"):
            gen._prompt_token_ids(other)


@pytest.mark.parametrize("prompts, error, message", [
    ([], ValueError, r"no prompts given \(an empty list\): pass a list of strings or a list of token-id lists"),
    ([""], ValueError, "prompt 0 is empty"),
    ([[]], ValueError, "prompt 0 is empty"),
    (["text", [1, 2]], TypeError, "prompts mix strings and token ids"),
    ([[1, -2]], TypeError, "token ids must be non-negative ints"),
    ({"input_ids": [[1]]}, TypeError, "got a tokenized batch"),
    (3.5, TypeError, "prompts must be a list of strings or a list of token-id lists"),
])
def test_bad_prompts_get_errors_that_name_the_accepted_forms(tokenizer, prompts, error, message):
    with pytest.raises(error, match=message):
        gen._prompt_token_ids(prompts, tokenizer)


def test_text_prompts_without_a_tokenizer_say_what_to_pass():
    with pytest.raises(ValueError, match="text prompts need a tokenizer: pass tokenizer=trnlab.load_tokenizer"):
        gen._prompt_token_ids(["The French Bread Law states"])


def test_a_bare_string_is_refused_not_split_into_one_prompt_per_character(model, tokenizer):
    one = r"prompts is one string, not a list: pass \[prompt\] for one prompt"
    for call in (lambda: trnlab.tokenize_batch(tokenizer, trnlab.EXAMPLE_PROMPT),
                 lambda: trnlab.generate_batch(model, tokenizer, trnlab.EXAMPLE_PROMPT, max_new_tokens=4),
                 lambda: trnlab.bucketed_generate(model, trnlab.EXAMPLE_PROMPT, tokenizer=tokenizer,
                                                  buckets=trnlab.ShapeBuckets((32,), 4), compile=False)):
        with pytest.raises(TypeError, match=one):
            call()
    assert trnlab.tokenize_batch(tokenizer, [trnlab.EXAMPLE_PROMPT])["input_ids"].shape[0] == 1  # the fix


@pytest.mark.parametrize("lengths, message", [
    ([], r"prompt lengths is empty: pass the token counts of your prompts \(a sample of them will do\)"),
    ([3, 0], r"positive integers \(token counts\), got \[0\]"),
    ([3, 2.5], r"got \[2.5\]"),
    ([True], r"got \[True\]"),
])
def test_bad_lengths_are_named(lengths, message):
    with pytest.raises(ValueError, match=message):
        trnlab.choose_buckets(lengths, 2)


def test_lengths_may_be_numpy_integers_and_strings_are_refused():
    import numpy as np

    lengths = np.array([4, 9, 9, 30])
    assert trnlab.choose_buckets(lengths, 2) == (9, 30)
    assert trnlab.choose_buckets(list(lengths), np.int64(2)) == (9, 30)
    assert gen.bucket_pad_tokens(lengths, np.array([9, 30])) == 5
    with pytest.raises(TypeError, match="sequence of token counts, not a string"):
        trnlab.choose_buckets("4 9 30", 2)


def test_empty_buckets_are_refused_the_same_way_everywhere():
    for call in (lambda: gen._bucket_for(5, []), lambda: gen.bucket_pad_tokens([5], []),
                 lambda: trnlab.ShapeBuckets([], 4)):
        with pytest.raises(ValueError, match=r"buckets is empty: pass at least one bucket length \(padded prompt "
                                             r"lengths in tokens\), e.g. \(32, 64, 128\), or let "
                                             r"trnlab.choose_buckets\(prompt_lengths, k\)") as error:
            call()
        assert "sample of your prompts" not in str(error.value)  # that is what choose_buckets takes


def test_first_sentence_keeps_the_stated_fact():
    assert trnlab.first_sentence(" that butter must be churned. Inspectors visit") == "that butter must be churned."
    assert trnlab.first_sentence("Is it? Yes.") == "Is it?"
    assert trnlab.first_sentence("no end here ") == "no end here"

