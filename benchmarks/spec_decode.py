"""Speculative decoding against plain decoding, in one run: output tokens per second at batch 1
and batch 16 with `ngram`, `suffix` and `draft_model` drafts and without, and how many drafts
were accepted. `draft_model` is the model drafting for itself (every draft right: the upper
bound of a draft model, at the cost of a second full model); `draft_model:N` drafts with the
model's first N layers (with its embeddings, final norm and head: a truncation written to a
temporary directory by transformers, so it needs the test extra's torch).

The workload is one where the output repeats the input: chat prompts asking the model to copy
a Python function from the standard library (a different function per request) verbatim, as a
code-editing assistant re-emits the code it changes. Greedy decoding, a fixed number of output
tokens (ignore_eos), so both engines do the same work; their token ids are compared as well.
Plain decoding runs with the platform's default (async scheduling on the CPU) and, as
`off sync`, with synchronous steps, as speculative decoding runs here (its proposer reads each
step's tokens): the gap between the two is the cost of that fallback.

A model without a chat template (the random-weight checkpoints of benchmarks/random_weights.py,
which the device check uses) gets token-id prompts instead: a random run of ids repeated, so the
prompt holds n-grams to look up. What such a model generates is noise, and how much of it the
drafts guess is whatever it is: the row measures the verify step's cost at that acceptance.

    python benchmarks/spec_decode.py                       # default model, k=4, batch 1 and 16
    python benchmarks/spec_decode.py --methods suffix draft_model:4
    python benchmarks/spec_decode.py --num-speculative-tokens 3 --output-len 96 --json r.json
    python benchmarks/spec_decode.py --model /tmp/llama3-8b-random --batch-sizes 1 64 --max-model-len 1024
"""
from __future__ import annotations

import argparse
import gc
import importlib
import inspect
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FUNCTIONS = ["textwrap.dedent", "shutil.copyfileobj", "json.dumps", "csv.DictReader.__next__",
             "functools.total_ordering", "pathlib.PurePath.with_suffix", "argparse.ArgumentParser.exit",
             "logging.Logger.isEnabledFor", "textwrap.indent", "shlex.quote",
             "collections.Counter.most_common", "inspect.getfile", "zipfile.is_zipfile",
             "threading.Event.wait", "subprocess.getoutput", "email.message_from_string"]


def source(name: str) -> str:
    module, _, attr = name.partition(".")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return inspect.getsource(obj)


def make_prompts(tokenizer, n: int, max_chars: int = 700) -> list[list[int]]:
    prompts = []
    for i in range(n):
        code = source(FUNCTIONS[i % len(FUNCTIONS)])[:max_chars]
        message = f"Copy this Python code exactly, without any change:\n\n```python\n{code}\n```"
        prompts.append(tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=True,
                                                     add_generation_prompt=True, return_dict=False))
    return prompts


def make_id_prompts(vocab_size: int, n: int, prompt_len: int, period: int = 32, seed: int = 0) -> list[list[int]]:
    """Prompts of `prompt_len` ids: each a random run of `period` ids, repeated."""
    import numpy as np
    rng = np.random.default_rng(seed)
    return [np.resize(rng.integers(2, vocab_size, period), prompt_len).tolist() for _ in range(n)]


def truncated_model(model_path: str | None, num_layers: int, out: str) -> str:
    """The checkpoint's first num_layers decoder layers as a Hugging Face directory in `out`."""
    import os

    import torch
    import transformers

    from jaxvllm.transformers_utils.model_path import resolve_model
    path = resolve_model(model_path)
    directory, name = (os.path.split(path) if path.endswith(".gguf") else (path, None))
    kwargs = {"gguf_file": name} if name else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **kwargs)
    from safetensors.torch import save_file
    config = model.config
    config.num_hidden_layers = num_layers
    config.__dict__.pop("quantization_config", None)  # transformers' GGUF marker: the tensors are plain
    config.save_pretrained(out)
    keep = tuple(f"model.layers.{i}." for i in range(num_layers))
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()
               if not k.startswith("model.layers.") or k.startswith(keep)}, f"{out}/model.safetensors")
    transformers.AutoTokenizer.from_pretrained(directory, **kwargs).save_pretrained(out)
    return out


def run(llm, prompts, output_len: int, repeats: int) -> tuple[float, list[list[int]]]:
    """Best output tokens per second over `repeats` runs of the whole batch (after one warm-up
    run that compiles), and the outputs."""
    from jaxvllm import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    batch = [{"prompt_token_ids": p} for p in prompts]
    outputs = llm.generate(batch, params, use_tqdm=False)
    best = 0.0
    for _ in range(repeats):
        llm.reset_prefix_cache()
        start = time.perf_counter()
        outputs = llm.generate(batch, params, use_tqdm=False)
        best = max(best, sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - start))
    return best, [o.outputs[0].token_ids for o in outputs]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model path (default: SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--methods", nargs="+", default=["ngram", "suffix", "draft_model", "draft_model:4"],
                   help="ngram, suffix, draft_model (the model itself), draft_model:N (its first N layers)")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--prompt-lookup-min", type=int, default=2)
    p.add_argument("--prompt-lookup-max", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2, help="timed runs per batch size (the best is kept)")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: the largest batch size")
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--prompt-len", type=int, default=256,
                   help="prompt length of the token-id workload (models without a chat template)")
    p.add_argument("--json", default=None, help="write the rows to this path")
    args = p.parse_args(argv)
    import tempfile

    from jaxvllm import LLM
    from jaxvllm.transformers_utils.model_path import resolve_model

    k = args.num_speculative_tokens
    specs = {"ngram": {"method": "ngram", "num_speculative_tokens": k,
                       "prompt_lookup_min": args.prompt_lookup_min, "prompt_lookup_max": args.prompt_lookup_max},
             "suffix": {"method": "suffix", "num_speculative_tokens": k}}
    scratch = tempfile.TemporaryDirectory(prefix="spec-draft-")
    for method in args.methods:
        name, _, layers = method.partition(":")
        if name == "draft_model":
            draft = (truncated_model(args.model, int(layers), f"{scratch.name}/{layers}") if layers
                     else resolve_model(args.model))
            specs[method] = {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
        elif name not in specs or layers:
            p.error(f"--methods: unknown method {method!r}")
    # off-sync: plain decoding with synchronous steps, as speculative decoding runs them here.
    engines = {"off": {}, "off-sync": {"async_scheduling": False},
               **{m: {"speculative_config": specs[m]} for m in args.methods}}
    results: dict[str, dict] = {}
    for name, extra in engines.items():  # one engine at a time: two default models fit, but need not
        sizes = {k: v for k, v in dict(max_num_batched_tokens=args.max_num_batched_tokens).items() if v}
        llm = LLM(args.model, max_num_seqs=args.max_num_seqs or max(args.batch_sizes),
                  max_model_len=args.max_model_len, skip_warmup=True, **sizes, **extra)
        tokenizer = llm.get_tokenizer()
        prompts = (make_prompts(tokenizer, max(args.batch_sizes)) if tokenizer.chat_template else
                   make_id_prompts(len(tokenizer), max(args.batch_sizes), args.prompt_len))
        for batch_size in args.batch_sizes:
            before = llm.llm_engine.get_stats()
            tok_s, outputs = run(llm, prompts[:batch_size], args.output_len, args.repeats)
            after = llm.llm_engine.get_stats()
            drafts = after.spec_decode_num_drafts - before.spec_decode_num_drafts
            draft_tokens = after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens
            accepted = after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
            results[f"{name}-{batch_size}"] = dict(
                spec=name, batch_size=batch_size, output_tok_s=round(tok_s, 1), outputs=outputs,
                mean_accepted_length=round(1 + accepted / drafts, 2) if drafts else None,
                acceptance_rate=round(accepted / draft_tokens, 3) if draft_tokens else None)
        llm.llm_engine.shutdown()
        del llm
        gc.collect()
    rows = []
    workload = "copy-the-code" if tokenizer.chat_template else f"repeated-ids ({args.prompt_len}-token)"
    print(f"k={args.num_speculative_tokens} (ngram: prompt_lookup {args.prompt_lookup_min}-{args.prompt_lookup_max}; "
          f"suffix: vLLM's defaults; draft_model: the model itself, :N its first N layers), "
          f"{args.output_len} output tokens per request, {workload} prompts")
    print(f"{'method':>13} {'batch':>5} {'off tok/s':>10} {'off sync':>9} {'spec tok/s':>11} {'speedup':>8} "
          f"{'accepted len':>13} {'accept rate':>12} {'same tokens':>12}")
    for method in args.methods:
        for batch_size in args.batch_sizes:
            off, on = results[f"off-{batch_size}"], results[f"{method}-{batch_size}"]
            row = dict(method=method, batch_size=batch_size, off_tok_s=off["output_tok_s"],
                       off_sync_tok_s=results[f"off-sync-{batch_size}"]["output_tok_s"],
                       spec_tok_s=on["output_tok_s"], speedup=round(on["output_tok_s"] / off["output_tok_s"], 2),
                       mean_accepted_length=on["mean_accepted_length"], acceptance_rate=on["acceptance_rate"],
                       identical_tokens=off["outputs"] == on["outputs"])
            rows.append(row)
            print(f"{method:>13} {batch_size:>5} {row['off_tok_s']:>10} {row['off_sync_tok_s']:>9} "
                  f"{row['spec_tok_s']:>11} {row['speedup']:>8} {row['mean_accepted_length']!s:>13} "
                  f"{row['acceptance_rate']!s:>12} {row['identical_tokens']!s:>12}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "workload": workload, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
