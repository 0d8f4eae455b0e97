"""The worker's LoRA adapters: device slots, a host cache, and the stacks the step reads
(vLLM's WorkerLoRAManager and LRUCacheLoRAModelManager).

The stacks (jaxvllm/layers/lora.py) have max_loras + 1 slots of rank max_lora_rank per part
of each adapted projection, fixed from construction: loading an adapter writes one slot with
a program compiled at start-up, so no adapter ever compiles anything. An adapter's slot is
kept while it is used (least recently used slots are reused first); its converted weights
stay in a host cache of max_cpu_loras adapters, so that a swapped-out adapter comes back
without reading its files again. The scheduler puts at most max_loras distinct adapters in a
step, so a step's adapters always fit.

A PEFT adapter adapts the checkpoint's q/k/v/o/gate/up/down projections; the model fuses
q/k/v and gate/up into one linear each. The family's weight spec already says how (its
sources and transform), so the adapter's B matrices go through that same transform, each
part's rank in its own block of the fused rank axis: the fused product is then exactly the
sum of the parts' products.
"""
from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np

from jaxvllm.config.engine_config import LoRAConfig
from jaxvllm.lora.peft_helper import SUPPORTED_MODULES, load_adapter, read_adapter
from jaxvllm.lora.request import LoRARequest
from jaxvllm.models.weight_spec import LINEAR


def _module(source: str) -> str:
    """'model.layers.0.self_attn.q_proj.weight' -> 'q_proj'."""
    return source.rsplit(".", 2)[-2]


class LoRAManager:
    def __init__(self, config: LoRAConfig, model, sharding, count_compilation):
        """model: the runner's CausalLM (its weight spec and args); sharding: where the stacks
        live (replicated over the mesh); count_compilation: the runner's counter, called once
        per trace of the slot writer."""
        self.config, self.num_slots, self.dtype = config, config.max_loras + 1, jnp.dtype(model.dtype)
        a, R = model.args, config.max_lora_rank
        self.out_sizes = {"q_proj": a.num_heads * a.head_dim, "k_proj": a.num_kv_heads * a.head_dim,
                          "v_proj": a.num_kv_heads * a.head_dim, "o_proj": a.hidden_size,
                          "gate_proj": a.intermediate_size, "up_proj": a.intermediate_size,
                          "down_proj": a.hidden_size}
        # Each adaptable linear of the layers: leaf -> its Weight in every layer.
        self.targets: dict[str, list] = {}
        for path, w in model.weights().items():
            if (w.kind == LINEAR and path.startswith("layers.") and w.sources
                    and all(_module(s) in SUPPORTED_MODULES for s in w.sources)):
                _, i, leaf = path.split(".", 2)
                self.targets.setdefault(leaf, [None] * a.num_layers)[int(i)] = w
        zeros = {leaf: (np.zeros((len(ws), ws[0].shape[0], self.num_slots, len(ws[0].sources) * R), self.dtype),
                        np.zeros((len(ws), self.num_slots, len(ws[0].sources) * R, *ws[0].shape[1:]), self.dtype))
                 for leaf, ws in self.targets.items()}

        def set_slot(stacks, slot, values):
            count_compilation()
            return {leaf: (A.at[:, :, slot].set(values[leaf][0]), B.at[:, slot].set(values[leaf][1]))
                    for leaf, (A, B) in stacks.items()}

        self._set_slot = jax.jit(set_slot, donate_argnums=(0,))
        # Slot 0 written with its zeros: the one program loading ever runs is compiled now.
        self.stacks = self._set_slot(jax.device_put(zeros, sharding), np.int32(0),
                                     {leaf: (A[:, :, 0], B[:, 0]) for leaf, (A, B) in zeros.items()})
        self.requests: dict[int, LoRARequest] = {}
        self.host_cache: collections.OrderedDict[int, dict] = collections.OrderedDict()
        self.slots: collections.OrderedDict[int, int] = collections.OrderedDict()  # LRU first
        self.free_slots = list(range(config.max_loras, 0, -1))

    def add_requests(self, new_reqs) -> None:
        """Remember the adapters new requests (NewRequestData) name, by lora_int_id."""
        for new in new_reqs:
            if new.lora_request is not None:
                self.requests[new.lora_request.lora_int_id] = new.lora_request

    def step_inputs(self, token_lora_ids: np.ndarray, num_tokens: int) -> tuple[dict, np.ndarray]:
        """(stacks, i32[num_tokens] slot per token) for a step whose real tokens run with
        these adapter ids (0: none); the padding runs in slot 0."""
        token_slots = np.zeros(num_tokens, np.int32)
        ids = [int(i) for i in np.unique(token_lora_ids) if i]
        for lora_id in ids:  # the step's loaded adapters first: none of them is reused below
            if lora_id in self.slots:
                self.slots.move_to_end(lora_id)
        for lora_id in ids:
            token_slots[:len(token_lora_ids)][token_lora_ids == lora_id] = self._slot(lora_id)
        return self.stacks, token_slots

    def warmup_inputs(self, num_tokens: int) -> tuple[dict, np.ndarray]:
        return self.stacks, np.zeros(num_tokens, np.int32)

    def _slot(self, lora_id: int) -> int:
        """The adapter's device slot, loading it into a free or the least recently used one."""
        if lora_id in self.slots:
            self.slots.move_to_end(lora_id)
            return self.slots[lora_id]
        slot = self.free_slots.pop() if self.free_slots else self.slots.pop(next(iter(self.slots)))
        self.stacks = self._set_slot(self.stacks, np.int32(slot), self._host_values(lora_id))
        self.slots[lora_id] = slot
        return slot

    def _host_values(self, lora_id: int) -> dict:
        if lora_id in self.host_cache:
            self.host_cache.move_to_end(lora_id)
            return self.host_cache[lora_id]
        lora = self.requests[lora_id]
        values = self.convert(load_adapter(read_adapter(lora.lora_path, self.config.max_lora_rank, lora.lora_name)))
        self.host_cache[lora_id] = values
        while len(self.host_cache) > self.config.max_cpu_loras:
            self.host_cache.popitem(last=False)
        return values

    def convert(self, tensors: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
        """A PEFT adapter's {base weight name: (A [r, in], B [out, r] scaled)} as one slot of
        the stacks: {leaf: (A [layers, in, parts * R], B [layers, parts * R, *out])}."""
        R, used, values = self.config.max_lora_rank, set(), {}
        for leaf, ws in self.targets.items():
            As, Bs = [], []
            for w in ws:
                n = len(w.sources)
                a, parts = np.zeros((w.shape[0], n * R), np.float32), []
                for j, source in enumerate(w.sources):
                    b = np.zeros((self.out_sizes[_module(source)], n * R), np.float32)
                    if source in tensors:
                        A, B = tensors[source]
                        if A.shape[1] != a.shape[0] or B.shape[0] != b.shape[0]:
                            raise ValueError(f"LoRA weights of {source} have shapes {A.shape} and {B.shape}; "
                                             f"the model needs [r, {a.shape[0]}] and [{b.shape[0]}, r].")
                        a[:, j * R:j * R + A.shape[0]] = A.T
                        b[:, j * R:j * R + A.shape[0]] = B
                        used.add(source)
                    parts.append(b)
                As.append(a)
                Bs.append(w.transform(w.key, *parts))
            values[leaf] = (np.stack(As).astype(self.dtype), np.stack(Bs).astype(self.dtype))
        unknown = sorted(set(tensors) - used)
        if unknown:
            raise ValueError(f"LoRA weights for {unknown[0]!r}: the model has no such projection.")
        return values
