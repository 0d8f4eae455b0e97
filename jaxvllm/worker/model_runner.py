"""ModelRunner: turns a SchedulerOutput into padded, bucketed device arrays and runs
the compiled step.

Two jitted functions make one step: `_forward` (model + KV write, then the final hidden
state of each request's last scheduled token; compiled once per token bucket, the KV cache
donated; with enable_lora, `_forward_lora` too, for the steps where some request has an
adapter) and `_sample` (LM head and sampling; compiled once per request bucket and sampler
variant: greedy or random, and where the platform keeps conditionals out of a step, with or
without top_k/top_p), plus `_sample_extended` for batches using penalties, biases, logprobs or
structured output, which keeps per-request rows on device: worker/penalties.py).
Splitting them keeps the number of compiled programs at tokens + requests instead of
tokens x requests, and the costly 49k-wide LM head runs only for the rows that sample
(and, for requests asking for prompt logprobs, `_prompt_logprobs` over their prompt
positions). Hidden states stay on device between the calls; only sampled token ids (and
requested logprobs) come back to the host.

The programs take the weights as flat tuples, the sampler's only the LM head's
(worker/step_params.py): every argument costs dispatch time on every step.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxvllm.backends import Backend
from jaxvllm.config import EngineConfig
from jaxvllm.core.kv_cache_interface import KVCacheGroupSpec
from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.layers.attention import in_kv_cache_groups
from jaxvllm.layers.lora import with_lora
from jaxvllm.models.layer_loops import capturing_layers
from jaxvllm.outputs import LogprobsLists, ModelRunnerOutput
from jaxvllm.worker import penalties
from jaxvllm.worker.async_output import AsyncModelRunnerOutput
from jaxvllm.worker.compiled_programs import COUNT_LOCK, CompiledProgram, executables_dir, fingerprint
from jaxvllm.worker.input_batch import InputBatch
from jaxvllm.worker.kv_swap import KVSwapper
from jaxvllm.worker.logprobs import step_prompt_logprobs
from jaxvllm.worker.lora_manager import LoRAManager
from jaxvllm.worker.model_runner_utils import make_buckets, pick_bucket
from jaxvllm.worker.sampler import compute_logprobs, sample, sample_extended
from jaxvllm.worker.sampling_inputs import penalty_metadata, sampler_variant, sampling_metadata
from jaxvllm.worker.step_inputs import build_step_inputs
from jaxvllm.worker.step_params import StepParams
from jaxvllm.worker.warmup import warmup, warmup_jobs


def with_tokens_in_flight(input_ids: jax.Array, prev_rows: jax.Array, last_sampled: jax.Array) -> jax.Array:
    """The step's input ids, where a position whose prev_rows names a batch row takes the
    token that row sampled last step, still on device (async scheduling); prev_rows is
    len(last_sampled) where the host's id stands."""
    S = last_sampled.shape[0]
    return jnp.where(prev_rows < S, last_sampled[jnp.minimum(prev_rows, S - 1)], input_ids)


def layer_groups_and_slots(groups: list[KVCacheGroupSpec] | None, num_layers: int):
    """Each layer's KV cache group and slot (None, None: one group, slot = layer)."""
    if not groups or len(groups) == 1:
        return None, None
    where = {int(name.split(".")[1]): (g, i) for g, group in enumerate(groups)
             for i, name in enumerate(group.layer_names) if name.startswith("layers.")}  # not a draft's
    return tuple(where[i][0] for i in range(num_layers)), tuple(where[i][1] for i in range(num_layers))


class ModelRunner:
    # Target layers whose entering hidden states the forward also returns (an EAGLE-3 draft's).
    aux_hidden_state_layers: tuple[int, ...] = ()
    draft_args = None  # a drafter's model args, which its saved programs depend on too

    def __init__(self, config: EngineConfig, model: nnx.Module, kv_cache: jax.Array, attend,
                 num_swap_blocks: int = 0, *, mesh: Mesh, backend: Backend,
                 abstract_mesh: AbstractMesh | None = None, abstract: bool = False,
                 kv_cache_groups: list[KVCacheGroupSpec] | None = None):
        """kv_cache_groups: the pool's groups (core/kv_cache_interface.py); None: one group of
        every layer, as the cache's slots. abstract_mesh: the mesh the step is traced against
        (default: `mesh`'s); an abstract TPU's stands in to lower the step for a TPU elsewhere
        (benchmarks/lower_step.py).
        abstract: allocate nothing, the runner's own device state being shape structs too, to
        compile its programs for devices that cannot run them (jaxvllm/aot_compile.py).
        backend: the engine's kernels and methods (jaxvllm/backends)."""
        self.config = config
        self.step_may_branch = backend.platform.step_may_branch  # else the host picks sampler variants
        self.compile_threads = backend.platform.compile_threads
        self.block_size = config.cache.block_size
        self.max_num_seqs = config.scheduler.max_num_seqs
        self.max_pages_per_seq = -(-config.scheduler.max_model_len // self.block_size)
        sched = config.scheduler
        self.token_buckets = make_buckets(min(sched.min_token_bucket, sched.max_num_batched_tokens),
                                          sched.max_num_batched_tokens)
        self.request_buckets = make_buckets(1, self.max_num_seqs)
        self.vocab_size = model.args.vocab_size
        self.hidden_size = model.args.hidden_size
        self.hidden_dtype = jax.numpy.dtype(config.dtype)
        self.kv_cache = kv_cache
        self.num_kv_cache_groups = len(kv_cache_groups) if kv_cache_groups else 1
        attend = in_kv_cache_groups(attend, *layer_groups_and_slots(kv_cache_groups, model.args.num_layers))
        self.input_batch = InputBatch(self.max_num_seqs, sched.max_model_len, self.max_pages_per_seq,
                                      self.num_kv_cache_groups)
        # Replicated over the mesh, like the hidden states the sampler reads beside it.
        # Made by one jitted program (three eager zeros compiled three: ~0.5 s of start-up).
        init_penalties = jax.jit(penalties.init_state, static_argnums=(0, 1), out_shardings=NamedSharding(mesh, P()))
        self.penalty_state = (jax.eval_shape(init_penalties, self.max_num_seqs, self.vocab_size) if abstract
                              else init_penalties(self.max_num_seqs, self.vocab_size))
        # Incremented at trace time: one trace is one compilation.
        self.num_compilations = 0
        self.num_warmup_compilations = 0
        self.after_first_step = None  # called once, after the first step's tokens are back
        self.swapper = (KVSwapper(kv_cache, num_swap_blocks, self._count_compilation)
                        if num_swap_blocks else None)

        graphdef, params = nnx.split(model)
        abstract_mesh = abstract_mesh or mesh.abstract_mesh
        self.step_params = sp = StepParams(graphdef, params, jax.ShapeDtypeStruct(
            (1, self.hidden_size), self.hidden_dtype), abstract_mesh)
        self.params = params  # also sets param_leaves and head_leaves

        S = self.max_num_seqs
        argmax = backend.sampler_argmax

        # With enable_lora, forward_lora also takes the adapters' stacks and each token's slot.
        self._replicated = rep = NamedSharding(mesh, P())
        self.lora_manager = (LoRAManager(config.lora, model, mesh, backend.float_linear_method,
                                         self._count_compilation, abstract)
                             if config.lora is not None else None)

        aux_layers, aux = self.aux_hidden_state_layers, []

        def forward(param_leaves, kv_cache, input_ids, prev_rows, last_sampled, md, logits_indices, *lora):
            """Also the hidden states entering aux_layers, side by side, where a runner asks."""
            input_ids = with_tokens_in_flight(input_ids, prev_rows, last_sampled)
            layer_loop = (with_lora(backend.layer_loop, self.lora_manager.layouts,
                                    self.lora_manager.num_slots, *lora[0]) if lora
                          else backend.layer_loop)
            if aux_layers:
                aux.clear()
                layer_loop = capturing_layers(layer_loop, aux_layers, aux)
            with jax.sharding.use_abstract_mesh(abstract_mesh):  # for the model's constraints
                hidden, kv_cache = sp.model(param_leaves)(input_ids, kv_cache, md, attend, layer_loop)
            if aux_layers:
                return hidden[logits_indices], hidden, kv_cache, jnp.concatenate(aux, axis=-1)
            return hidden[logits_indices], hidden, kv_cache

        # num_reqs: the real rows of the request bucket; the LM head skips the others.
        # Each sampler also keeps its tokens on device, by batch row (`last_sampled`, S past
        # the real rows), for the next step's inputs.
        def sample_fn(head_leaves, hidden, sampling_md, num_reqs, last_sampled, rows, all_greedy, top_k_top_p):
            with jax.sharding.use_abstract_mesh(abstract_mesh):
                R = sampling_md.temperature.shape[0]
                logits = sp.head_model(head_leaves).compute_logits(hidden[:R], num_reqs)
                tokens = sample(logits, sampling_md, all_greedy, top_k_top_p, argmax)
                return tokens, last_sampled.at[rows].set(tokens, mode="drop")

        def sample_extended_fn(head_leaves, hidden, sampling_md, num_reqs, penalty_state, penalty_md,
                               last_sampled, rows, all_greedy, top_k_top_p):
            with jax.sharding.use_abstract_mesh(abstract_mesh):
                R = sampling_md.temperature.shape[0]
                logits = sp.head_model(head_leaves).compute_logits(hidden[:R], num_reqs)
                tokens, lp, penalty_state = sample_extended(logits, sampling_md, penalty_state, penalty_md,
                                                            all_greedy, top_k_top_p, argmax)
                return tokens, lp, penalty_state, last_sampled.at[rows].set(tokens, mode="drop")

        def prompt_logprobs_fn(head_leaves, hidden, indices, targets):
            with jax.sharding.use_abstract_mesh(abstract_mesh):
                logits = sp.head_model(head_leaves).compute_logits(hidden[indices])
                return compute_logprobs(logits, targets)

        # Weights and cache keep their shardings; step inputs and hidden states are replicated.
        params_sharding = tuple(x.sharding for x in self.param_leaves)
        # The layer loop too: a program saved under one loop must not serve a run forcing the other.
        key = fingerprint(config, model.args, mesh.devices.shape, backend.layer_loop.__name__, self.draft_args)
        self._executables_dir = (
            executables_dir() if backend.platform.serialize_executables and jax.process_count() == 1 else None)
        self._program_key, self._devices = key, list(mesh.devices.flat)
        program = self._program

        # fixed_argnums: the weights, the KV cache, the penalty rows and last_sampled never
        # change shape.
        self.last_sampled = (jax.ShapeDtypeStruct((S,), np.int32, sharding=rep) if abstract
                             else jax.device_put(np.zeros(S, np.int32), rep))
        forward_shardings = (params_sharding, kv_cache.sharding, rep, rep, rep, rep, rep)
        forward_out = (rep, rep, kv_cache.sharding) + ((rep,) if aux_layers else ())
        self._forward = program("forward", forward, (0, 1, 4), donate_argnums=(1,),
                                in_shardings=forward_shardings, out_shardings=forward_out)
        # With enable_lora, a step where some token has an adapter runs this one; a step with
        # none runs the plain forward above (the host picks by the step's slots): the adapters'
        # products cost nothing while no request uses one, and no program branches on it.
        self._forward_lora = (program("forward_lora", forward, (0, 1, 4), donate_argnums=(1,),
                                      in_shardings=forward_shardings + ((self.lora_manager.shardings, rep),),
                                      out_shardings=(rep, rep, kv_cache.sharding))
                              if self.lora_manager else None)
        sampler_static = ("all_greedy", "top_k_top_p")
        self._sample = program("sample", sample_fn, (0, 4), static_argnames=sampler_static,
                               donate_argnums=(4,))
        self._sample_extended = program("sample_extended", sample_extended_fn, (0, 4, 6),
                                        static_argnames=sampler_static, donate_argnums=(4, 6))
        self._set_row = program("set_row", penalties.set_row, (0,), donate_argnums=(0,))
        self._prompt_logprobs = program("prompt_logprobs", prompt_logprobs_fn, (0,))

    def _program(self, name, fn, fixed_argnums, **jit_kwargs) -> CompiledProgram:
        """A step program, counted at trace time (one trace is one compilation) and saved
        under the runner's fingerprint (worker/compiled_programs.py)."""
        def traced(*args, **kwargs):
            self._count_compilation()
            return fn(*args, **kwargs)
        return CompiledProgram(name, fn, jax.jit(traced, **jit_kwargs), self._program_key,
                               self._executables_dir, self._devices, fixed_argnums)

    @property
    def params(self):
        """The model's weights (an nnx State); setting them (weight updates, wake-up) sets the
        flat tuples the programs take."""
        return self._params

    @params.setter
    def params(self, params) -> None:
        self._params = params
        self.param_leaves, self.head_leaves = self.step_params.split(params)

    def _count_compilation(self) -> None:
        with COUNT_LOCK:  # programs may be traced on several threads (warm-up)
            self.num_compilations += 1

    # ---- one step -----------------------------------------------------------------
    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_model_async(out).get_output()

    def execute_model_async(self, out: SchedulerOutput) -> AsyncModelRunnerOutput:
        """Dispatches the step and returns before its tokens are back: the device reads a
        token still in flight from the last step's sampler (`last_sampled`), never the host."""
        batch = self.input_batch
        for state in batch.update_states(out):
            if state.has_row:
                self._write_row(state)
        if self.lora_manager is not None:
            self.lora_manager.add_requests(out.scheduled_new_reqs)
        if out.blocks_to_swap_out or out.blocks_to_swap_in:
            self.kv_cache = self.swapper.swap(self.kv_cache, out.blocks_to_swap_out, out.blocks_to_swap_in)
        N = len(out.num_scheduled_tokens)
        if out.total_num_scheduled_tokens == 0:
            return AsyncModelRunnerOutput(batch, [], *(np.zeros(0, t) for t in (np.int32, bool, np.int64)),
                                          np.zeros(0, np.int32))
        req_ids = list(out.num_scheduled_tokens)
        counts = np.fromiter(out.num_scheduled_tokens.values(), np.int32, N)
        rows = np.fromiter(map(batch.slot_of.__getitem__, req_ids), np.int32, N)
        with jax.profiler.TraceAnnotation("prepare_inputs"):
            T = pick_bucket(self.token_buckets, out.total_num_scheduled_tokens)
            inputs = build_step_inputs(batch, rows, counts, T, self.block_size)
            forward, lora = self._forward, ()
            if self.lora_manager is not None and batch.lora_int_id[rows].any():
                forward = self._forward_lora
                lora = (self.lora_manager.step_inputs(np.repeat(batch.lora_int_id[rows], counts), T),)
        with jax.profiler.TraceAnnotation("model_step"):
            hidden, all_hidden, self.kv_cache = forward(
                self.param_leaves, self.kv_cache, inputs.input_ids, inputs.prev_rows, self.last_sampled,
                inputs.md, inputs.logits_indices, *lora)
        prompt_logprobs = self._prompt_logprobs_of(rows, counts, inputs.commit, all_hidden, T)
        with jax.profiler.TraceAnnotation("prepare_inputs"):
            R = pick_bucket(self.request_buckets, N)
            sampling_md, all_greedy = sampling_metadata(batch, rows, R, self.vocab_size)
            variant = sampler_variant(sampling_md, all_greedy, self.vocab_size, self.step_may_branch)
            sample_rows = np.full(R, self.max_num_seqs, np.int32)  # padding rows write nothing
            sample_rows[:N] = rows
        logprobs = num_logprobs = None
        with jax.profiler.TraceAnnotation("sampling"):
            if batch.extended[rows].any():
                grammar_rows = {}
                if out.grammar_bitmask:
                    index = {r: i for i, r in enumerate(req_ids)}
                    grammar_rows = {index[r]: words for r, words in out.grammar_bitmask.items()}
                penalty_md = penalty_metadata(batch, rows, inputs.commit, R, self.max_num_seqs,
                                              self.vocab_size, grammar_rows)
                sampled, logprobs, self.penalty_state, self.last_sampled = self._sample_extended(
                    self.head_leaves, hidden, sampling_md, np.int32(N), self.penalty_state, penalty_md,
                    self.last_sampled, sample_rows, **variant)
                num_logprobs = batch.num_logprobs[rows]
                if not (num_logprobs >= 0).any():
                    logprobs = None
            else:
                sampled, self.last_sampled = self._sample(self.head_leaves, hidden, sampling_md, np.int32(N),
                                                          self.last_sampled, sample_rows, **variant)
        batch.num_computed_tokens[rows] += counts
        batch.num_tokens[rows[inputs.commit]] += 1  # its value arrives with get_output
        self._check_recompilation()
        on_ready, self.after_first_step = self.after_first_step, None
        return AsyncModelRunnerOutput(batch, req_ids, rows, inputs.commit, batch.generation[rows], sampled,
                                      logprobs, num_logprobs, prompt_logprobs, on_ready)

    def _check_recompilation(self) -> None:
        if self.config.compilation.check_recompilation and self.num_compilations > self.num_warmup_compilations:
            raise RuntimeError(
                f"check_recompilation: {self.num_compilations - self.num_warmup_compilations} "
                f"program(s) compiled after warm-up (a shape outside the warmed buckets).")

    def _prompt_logprobs_of(self, rows, counts, commit, all_hidden, T) -> dict[str, LogprobsLists]:
        if not self.input_batch.owing_prompt_logprobs:
            return {}
        with jax.profiler.TraceAnnotation("prompt_logprobs"):
            return step_prompt_logprobs(self.input_batch, rows, counts, commit, T, lambda indices, targets:
                                        self._prompt_logprobs(self.head_leaves, all_hidden, indices, targets))

    def _write_row(self, state) -> None:
        batch, n = self.input_batch, state.num_prompt_tokens
        counts, prompt_mask, bias = penalties.build_row(
            state.sampling_params, batch.token_list(state, 0, n), batch.token_list(state, n),
            self.vocab_size)
        self.penalty_state = self._set_row(self.penalty_state, np.int32(state.slot), counts,
                                           prompt_mask, bias)

    # ---- compile discipline (worker/warmup.py) -------------------------------------
    def warmup(self) -> None:
        warmup(self)

    @property
    def programs(self) -> tuple[CompiledProgram, ...]:
        lora = () if self._forward_lora is None else (self._forward_lora,)
        return (self._forward, *lora, self._prompt_logprobs, self._sample, self._sample_extended, self._set_row)

    def warmup_jobs(self) -> list[tuple[CompiledProgram, tuple, dict]]:
        return warmup_jobs(self)
