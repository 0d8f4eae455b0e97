"""Speculative decoding (methods ngram, suffix and draft_model) end to end on a tiny random Llama: greedy output
identical with and without it (stop tokens, max_tokens and chunked prefill included), drafts
accepted and counted, seeded random sampling reproducible, aborts and finishes return every
block, and the combinations not supported yet refused by name."""
from __future__ import annotations

import pytest
import regex  # partial matches (transformers' dependency)
from conftest import write_tiny_llama

from jaxvllm import LLM, SamplingParams
from jaxvllm.sampling_params import StructuredOutputsParams

# Prompts that repeat themselves, so that n-gram drafts exist and get accepted.
PROMPTS = [[10, 11, 12, 13, 14] * 4, [40, 41, 42] * 6 + [40], [7, 8, 9, 100, 7, 8, 9], [50 + i for i in range(30)]]
N_NEW = 24
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 3}
DRAFT = {"method": "draft_model", "num_speculative_tokens": 3}  # "model": the draft fixture's


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    """The tiny Llama's first layer alone (write_tiny_llama draws the weights in order: the same
    embeddings, head and layer 0): a real draft, right often but not always."""
    path = tmp_path_factory.mktemp("draft")
    write_tiny_llama(path, num_layers=1)
    return path


def make_llm(path, **kwargs):
    args = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128, num_gpu_blocks_override=64,
                skip_warmup=True)
    return LLM(str(path), **{**args, **kwargs})


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    return make_llm(tiny_model_dir)


@pytest.fixture(scope="module", params=[SPEC, SUFFIX, DRAFT], ids=["ngram", "suffix", "draft_model"])
def spec(tiny_model_dir, draft_dir, request):
    config = dict(request.param, model=str(draft_dir)) if request.param is DRAFT else request.param
    llm = make_llm(tiny_model_dir, speculative_config=config)
    yield llm
    llm.llm_engine.shutdown()


def tokens(llm, params, prompts=PROMPTS):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def assert_pool_full(llm):
    scheduler = llm.llm_engine.engine_core.scheduler
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1 and not scheduler.requests


def test_greedy_output_is_identical_and_drafts_are_accepted(plain, spec):
    params = SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True)
    expected = tokens(plain, params)
    assert tokens(spec, params) == expected
    stats = spec.llm_engine.get_stats()
    assert stats.spec_decode_num_drafts > 0 and stats.spec_decode_num_accepted_tokens > 0
    assert len(stats.spec_decode_num_accepted_tokens_per_pos) == 3
    assert stats.spec_decode_num_accepted_tokens_per_pos[0] >= stats.spec_decode_num_accepted_tokens_per_pos[2]
    assert_pool_full(spec)


def test_stops_inside_accepted_runs_match_plain_decoding(plain, spec):
    greedy = tokens(plain, SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True))
    for i, out in enumerate(greedy):
        stop = out[N_NEW // 2]  # a token the output reaches, maybe inside an accepted run
        for params in (SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True, stop_token_ids=[stop]),
                       SamplingParams(temperature=0, max_tokens=5 + i, ignore_eos=True)):
            expected = plain.generate([PROMPTS[i]], params, use_tqdm=False)[0].outputs[0]
            got = spec.generate([PROMPTS[i]], params, use_tqdm=False)[0].outputs[0]
            assert (got.token_ids, got.finish_reason, got.stop_reason) == (
                expected.token_ids, expected.finish_reason, expected.stop_reason)
    assert_pool_full(spec)


def test_chunked_prefill_and_seeded_sampling(tiny_model_dir, spec):
    chunked = make_llm(tiny_model_dir, speculative_config=spec.llm_engine.config.speculative, max_num_batched_tokens=8)
    params = SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True)
    assert tokens(chunked, params) == tokens(spec, params)
    seeded = [SamplingParams(temperature=1.0, top_p=0.9, seed=s, max_tokens=N_NEW, ignore_eos=True) for s in (1, 2)]
    first = tokens(spec, seeded[0], PROMPTS[:2]), tokens(spec, seeded[1], PROMPTS[:2])
    assert first[0] != first[1]
    # A seeded sample follows from its drafts; suffix decoding's drafts depend on the responses
    # cached since (as in vLLM), prompt lookup's and a draft model's on the request alone.
    if spec.llm_engine.config.speculative.method != "suffix":
        assert tokens(spec, seeded[0], PROMPTS[:2]) == first[0]
    assert_pool_full(spec)
    assert_pool_full(chunked)


def test_a_repeated_request_drafts_from_the_first_ones_response_with_suffix_decoding(plain, spec):
    """Suffix decoding keeps responses across requests: the same prompt again (nothing repeats
    within it) gets most of its tokens drafted and accepted. Prompt lookup keeps nothing."""
    prompt, params = [[120 + i for i in range(30)]], SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True)
    accepted = []
    for _ in range(2):
        before = spec.llm_engine.get_stats().spec_decode_num_accepted_tokens
        assert tokens(spec, params, prompt) == tokens(plain, params, prompt)
        accepted.append(spec.llm_engine.get_stats().spec_decode_num_accepted_tokens - before)
    if spec.llm_engine.config.speculative.method == "suffix":
        assert accepted[1] >= N_NEW // 2 and accepted[1] > accepted[0], accepted
    else:
        assert accepted[1] == accepted[0], accepted
    assert_pool_full(spec)


def test_logprobs_and_prompt_logprobs_are_the_plain_engines(plain, spec):
    """Each token of an accepted run gets its raw logprob, rank and top k, as the plain engine
    gives them, and the prompt its prompt logprobs; a stop inside the run leaves none after it."""
    greedy = tokens(plain, SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True))
    for params in (SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True, logprobs=2, prompt_logprobs=1),
                   SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True, logprobs=0,
                                  stop_token_ids=[greedy[0][N_NEW // 2]])):
        want = plain.generate(PROMPTS, params, use_tqdm=False)
        got = spec.generate(PROMPTS, params, use_tqdm=False)
        for w, g in zip(want, got):
            w, g = w.outputs[0], g.outputs[0]
            assert g.token_ids == w.token_ids and len(g.logprobs) == len(g.token_ids)
            for wp, gp in zip(w.logprobs, g.logprobs):
                assert wp.keys() == gp.keys()
                for t in wp:
                    assert abs(wp[t].logprob - gp[t].logprob) < 1e-4 and wp[t].rank == gp[t].rank
            assert abs(w.cumulative_logprob - g.cumulative_logprob) < 1e-3
        for w, g in zip(want, got):  # prompt logprobs (None for the first position)
            assert (w.prompt_logprobs is None) == (g.prompt_logprobs is None)
            for wp, gp in zip(w.prompt_logprobs or [], g.prompt_logprobs or []):
                assert (wp is None and gp is None) or (wp.keys() == gp.keys() and all(
                    abs(wp[t].logprob - gp[t].logprob) < 1e-4 for t in wp))
    assert spec.llm_engine.get_stats().spec_decode_num_accepted_tokens > 0
    assert_pool_full(spec)


def test_structured_output_masks_every_drafted_position(plain, spec):
    """Drafts the grammar does not allow are dropped before their step, each verified
    position samples under the grammar's mask after the drafts before it: the plain
    engine's constrained tokens, greedy and seeded, with drafts accepted."""
    before = spec.llm_engine.get_stats().spec_decode_num_accepted_tokens
    for pattern in ("[0-9]+", "(0|1|2)+(a|b)+[0-9]*"):
        so = StructuredOutputsParams(regex=pattern)
        for params in (SamplingParams(temperature=0, max_tokens=N_NEW, structured_outputs=so),
                       SamplingParams(temperature=0.8, seed=3, max_tokens=N_NEW, structured_outputs=so)):
            want = plain.generate(PROMPTS, params, use_tqdm=False)
            got = spec.generate(PROMPTS, params, use_tqdm=False)
            for w, g in zip(want, got):
                if params.temperature == 0:
                    assert g.outputs[0].token_ids == w.outputs[0].token_ids
                out = g.outputs[0]  # the whole pattern, or a prefix of it where max_tokens cut it
                assert regex.fullmatch(pattern, out.text, partial=out.finish_reason == "length"), out.text
    assert spec.llm_engine.get_stats().spec_decode_num_accepted_tokens > before
    assert_pool_full(spec)


def test_aborts_with_drafts_in_flight_return_every_block(spec):
    engine = spec.llm_engine
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"abort-{i}", {"prompt_token_ids": prompt},
                           SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    for _ in range(4):
        engine.step()
    assert any(r.spec_token_ids for r in engine.engine_core.scheduler.requests.values())
    engine.abort_request([f"abort-{i}" for i in range(len(PROMPTS))])
    while engine.has_unfinished_requests():
        engine.step()
    assert_pool_full(spec)


def test_penalties_and_biases_see_the_drafts_before_each_position(plain, spec):
    """Each verified position is penalized with the output counts as if the drafts before it
    had been sampled one at a time, biases and allowed tokens apply at every position, and
    the accepted tokens are counted for the next step: the plain engine's greedy tokens, with
    requests without penalties in the same batches."""
    before = spec.llm_engine.get_stats().spec_decode_num_accepted_tokens
    plain_params = SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True)
    for extra in (dict(repetition_penalty=1.2), dict(frequency_penalty=0.3, presence_penalty=0.2),
                  dict(logit_bias={12: 2.0, 13: -1.0}, bad_words=[]),
                  dict(allowed_token_ids=list(range(10, 60)))):
        params = [SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True, **extra), plain_params] * 2
        assert tokens(spec, params) == tokens(plain, params), extra
    assert spec.llm_engine.get_stats().spec_decode_num_accepted_tokens > before
    assert_pool_full(spec)


def test_unsupported_combinations_are_refused(tiny_model_dir, spec):
    with pytest.raises(ValueError, match="async_scheduling"):
        make_llm(tiny_model_dir, speculative_config=SPEC, async_scheduling=True)
    with pytest.raises(ValueError, match="method"):
        make_llm(tiny_model_dir, speculative_config={"method": "eagle", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="suffix_decoding_min_token_prob must be a number in"):
        make_llm(tiny_model_dir, speculative_config={"method": "suffix", "suffix_decoding_min_token_prob": 2})
    with pytest.raises(ValueError, match="unknown fields"):
        make_llm(tiny_model_dir, speculative_config='{"method": "ngram", "num_speculative_tokens": 2, "k": 1}')


def test_a_draft_model_drafting_for_itself_is_always_right(tiny_model_dir, plain):
    """The target as its own draft: every draft accepted (the drafts' KV, written in the
    lookahead slots and again over the step's tokens, is the target's own), whatever the
    chunking; the stats count them all."""
    llm = make_llm(tiny_model_dir, max_num_batched_tokens=16,
                   speculative_config=dict(DRAFT, model=str(tiny_model_dir)))
    params = SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True)
    assert tokens(llm, params) == tokens(plain, params)
    stats = llm.llm_engine.get_stats()
    assert stats.spec_decode_num_draft_tokens == stats.spec_decode_num_accepted_tokens > 0
    assert_pool_full(llm)
    llm.llm_engine.shutdown()


def test_a_draft_model_must_share_the_vocabulary_and_the_kv_pages(tmp_path, tiny_model_dir):
    write_tiny_llama(tmp_path / "vocab", vocab_size=128, num_layers=1)
    with pytest.raises(ValueError, match="vocabulary of 128 tokens, the target 256"):
        make_llm(tiny_model_dir, speculative_config=dict(DRAFT, model=str(tmp_path / "vocab")))
    write_tiny_llama(tmp_path / "heads", num_kv_heads=1, num_layers=1)
    with pytest.raises(ValueError, match="same KV heads and head size"):
        make_llm(tiny_model_dir, speculative_config=dict(DRAFT, model=str(tmp_path / "heads")))
    with pytest.raises(ValueError, match="speculative_config.model names the draft of methods"):
        make_llm(tiny_model_dir, speculative_config=dict(SPEC, model=str(tiny_model_dir)))
    with pytest.raises(FileNotFoundError, match="Model path does not exist"):
        make_llm(tiny_model_dir, speculative_config=dict(DRAFT, model=str(tmp_path / "nowhere")))
    write_tiny_llama(tmp_path / "short", num_layers=1, max_position_embeddings=64)
    with pytest.raises(ValueError, match="holds 64 positions, fewer than max_model_len=128"):
        make_llm(tiny_model_dir, speculative_config=dict(DRAFT, model=str(tmp_path / "short")))


@pytest.mark.parametrize("preemption_mode", ["swap"])  # recompute: every family's test (tests/models)
def test_preemption_and_parallel_samples_keep_greedy_output(tiny_model_dir, plain, spec, preemption_mode):
    """n=2 greedy samples of each prompt in a pool of 10 blocks, far less than the 8 sequences
    need: requests are preempted, swapped out with their drafts' KV and back, and every sample
    is the plain engine's greedy output."""
    llm = make_llm(tiny_model_dir, speculative_config=spec.llm_engine.config.speculative, num_gpu_blocks_override=10,
                   preemption_mode=preemption_mode, swap_space=0.01)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = tokens(plain, params)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, n=2),
                           use_tqdm=False)
    assert [[c.token_ids for c in o.outputs] for o in outputs] == [[w, w] for w in want]
    core = llm.llm_engine.engine_core
    assert core.scheduler.num_preemptions > 0 and llm.llm_engine.get_stats().spec_decode_num_accepted_tokens > 0
    assert core.scheduler.num_swap_outs > 0
    assert_pool_full(llm)
    llm.llm_engine.shutdown()
