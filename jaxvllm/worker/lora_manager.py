"""The worker's LoRA adapters: device slots, a host cache, and the stacks the step reads
(vLLM's WorkerLoRAManager and LRUCacheLoRAModelManager).

The stacks (jaxvllm/layers/lora.py) have max_loras slots of rank max_lora_rank per part of
each adapted projection, fixed from construction and sharded as their base layer: loading an
adapter writes one slot with a program compiled at start-up, so no adapter ever compiles
anything. Where the backend's linear method stores a weight in its own form (the CPU's
packed panels), the same program also rewrites that form from the written stacks; on one
device with a method that has a grouped matmul (the CPU's packed kernel), that form is per
(layer, slot), layers/lora.py's grouped form. An adapter's slot is kept while it is used
(least recently used slots are reused first); its converted weights stay in a host cache of
max_cpu_loras adapters, so that a swapped-out adapter comes back without reading its files
again. The scheduler puts at most max_loras distinct adapters in a step, so a step's adapters
always fit.

A PEFT adapter adapts the checkpoint's q/k/v/o/gate/up/down projections; the model fuses
q/k/v and gate/up into one linear each. The family's weight spec already says how (its
sources and transform): the same transform run over the parts' numbers tells where each
part lies in the fused out axes, so each part's B is stored in its own slice of the fused
layout, and the parts' deltas join as the base's outputs do.
"""
from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxvllm.config.engine_config import LoRAConfig
from jaxvllm.distributed.partition import fit_spec
from jaxvllm.layers.linear import UnquantizedLinearMethod
from jaxvllm.layers.lora import LoRALayout
from jaxvllm.lora.peft_helper import SUPPORTED_MODULES, load_adapter, read_adapter
from jaxvllm.lora.request import LoRARequest
from jaxvllm.models.hf_weights import fit
from jaxvllm.models.weight_spec import LINEAR


def _module(source: str) -> str:
    """'model.layers.0.self_attn.q_proj.weight' -> 'q_proj'."""
    return source.rsplit(".", 2)[-2]


def part_bounds(w, out_sizes: dict) -> tuple[int, list[tuple[int, int]]]:
    """(axis, [(start, stop) per part]): where the parts of the linear w lie along one of its
    out axes, found by running its transform over each part's number."""
    if len(w.sources) == 1:
        return 0, [(0, w.shape[1])]
    ids = w.transform(w.key, *[np.full((out_sizes[_module(s)], 1), j, np.float32)
                               for j, s in enumerate(w.sources)])[0]
    for axis in range(ids.ndim):
        first = ids[tuple(slice(None) if d == axis else slice(0, 1) for d in range(ids.ndim))].reshape(-1)
        if (ids == first.reshape([-1 if d == axis else 1 for d in range(ids.ndim)])).all():
            starts = [int(np.argmax(first == j)) for j in range(len(w.sources))]
            bounds = [(a, b) for a, b in zip(starts, starts[1:] + [len(first)])]
            if all((first[a:b] == j).all() for j, (a, b) in enumerate(bounds)):
                return axis, bounds
    raise NotImplementedError(f"LoRA on {w.key}: its parts are not contiguous along one of its out axes.")


def _method(method, in_features: int, out_shapes: list, dtype):
    """The backend's float method where it takes every weight of these shapes, else XLA's."""
    return method if all(method.supports(in_features, o, dtype) for o in out_shapes) else UnquantizedLinearMethod()


def _grouped_width(method, in_features: int, rank: int, parts: list, dtype) -> int | None:
    """The width a slot's A takes in the grouped form (its parts' ranks, padded to a width
    the method stores), or None where the method cannot run the grouped form for these shapes."""
    if not hasattr(method, "apply_grouped") or not all(method.supports(rank, p, dtype) for p in parts):
        return None
    width = len(parts) * rank
    return next((w for w in range(width, width + 1024) if method.supports(in_features, (w,), dtype)), None)


def _store(method, W):
    """Layer-stacked weights [layers, in, *out] in the form `method` stores them; None where
    that is the given form (the step reads the given stacks: no second copy)."""
    if method.weight_shape(W.shape[1], W.shape[2:]) == W.shape[1:]:
        return None
    return jax.vmap(method.process_weights_after_loading)(W)


class LoRAManager:
    def __init__(self, config: LoRAConfig, model, mesh, method, count_compilation, abstract: bool = False):
        """model: the runner's CausalLM (its weight spec and args); mesh: where the stacks live,
        each sharded as its base layer; method: the backend's float linear method for this
        mesh, which runs the adapters' products; count_compilation: the runner's counter,
        called once per trace of the slot writer; abstract: the stacks are shape structs with
        their shardings, nothing is written (compiling for devices that cannot run, as
        jaxvllm/aot_compile.py does)."""
        self.config, self.num_slots, self.dtype = config, config.max_loras, np.dtype(model.dtype)
        a, R, S = model.args, config.max_lora_rank, config.max_loras
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
        # Per leaf: A [layers, in, parts * slots * R] and per part B [layers, slots * R, *its out]
        # (the form a linear weight is given in), split over the mesh as the base weight.
        self.layouts, self.bounds, self.a_widths, shapes, shardings = {}, {}, {}, {}, {}
        for leaf, ws in self.targets.items():
            w, n = ws[0], len(ws[0].sources)
            axis, bounds = part_bounds(w, self.out_sizes)
            parts = [w.shape[1:1 + axis] + (b - a_,) + w.shape[2 + axis:] for a_, b in bounds]
            self.bounds[leaf] = (axis, bounds)
            width = _grouped_width(method, w.shape[0], R, parts, self.dtype) if mesh.size == 1 else None
            if width is not None:
                self.layouts[leaf] = LoRALayout(method, method, axis, tuple(parts), R, grouped=True)
                self.a_widths[leaf] = width
            else:
                self.layouts[leaf] = LoRALayout(_method(method, w.shape[0], [(S * n * R,)], self.dtype),
                                                _method(method, S * R, parts, self.dtype), axis, tuple(parts), R)
            shapes[leaf] = A, Bs = (len(ws), w.shape[0], S * n * R), [(len(ws), S * R, *p) for p in parts]
            shardings[leaf] = (NamedSharding(mesh, fit_spec((None, w.partition[0], None), A, mesh)),
                               tuple(NamedSharding(mesh, fit_spec((None, None, *w.partition[1:]), B, mesh))
                                     for B in Bs))

        def set_slot(stacks, slot, values):
            """Writes one slot of the stacks; returns them and the form the step reads."""
            count_compilation()
            out = {}
            for leaf, (A, Bs) in stacks.items():
                L, k, _ = A.shape
                n = len(Bs)
                A = A.reshape(L, k, n, S, R).at[:, :, :, slot].set(
                    values[leaf][0].reshape(L, k, n, R)).reshape(A.shape)
                Bs = tuple(B.reshape(L, S, R, *B.shape[2:]).at[:, slot].set(v).reshape(B.shape)
                           for B, v in zip(Bs, values[leaf][1]))
                out[leaf] = (A, Bs)
            return out, {leaf: self._stored(leaf, A, Bs) for leaf, (A, Bs) in out.items()}

        self._set_slot = jax.jit(set_slot, donate_argnums=(0,),
                                 out_shardings=(shardings, NamedSharding(mesh, P())))
        if abstract:
            given = {leaf: (jax.ShapeDtypeStruct(A, self.dtype, sharding=shardings[leaf][0]),
                            tuple(jax.ShapeDtypeStruct(B, self.dtype, sharding=sb)
                                  for B, sb in zip(Bs, shardings[leaf][1])))
                     for leaf, (A, Bs) in shapes.items()}
            stored = jax.eval_shape(lambda g: {leaf: self._stored(leaf, *g[leaf]) for leaf in g}, given)
            rep = NamedSharding(mesh, P())  # the slot writer's out_shardings for the stored form
            self._given = given
            self.stacks = self._merged(given, jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), stored))
        else:  # slot 0 written with its zeros: the one program loading ever runs is compiled now
            self._given = jax.device_put({leaf: (np.zeros(A, self.dtype), tuple(np.zeros(B, self.dtype) for B in Bs))
                                          for leaf, (A, Bs) in shapes.items()}, shardings)
            self._write(0, {leaf: (np.zeros((A[0], A[1], A[2] // S), self.dtype),
                                   tuple(np.zeros((B[0], R, *B[2:]), self.dtype) for B in Bs))
                            for leaf, (A, Bs) in shapes.items()})
        self.shardings = jax.tree.map(lambda x: x.sharding, self.stacks)  # what the step takes
        self.requests: dict[int, LoRARequest] = {}
        self.host_cache: collections.OrderedDict[int, dict] = collections.OrderedDict()
        self.slots: collections.OrderedDict[int, int] = collections.OrderedDict()  # LRU first
        self.free_slots = list(range(config.max_loras - 1, -1, -1))

    def _stored(self, leaf: str, A, Bs):
        lay = self.layouts[leaf]
        if not lay.grouped:
            return _store(lay.a_method, A), tuple(_store(lay.b_method, B) for B in Bs)
        # Per (layer, slot): A [in, parts * rank] (columns padded to the stored width) and
        # each part's B [rank, *out], in the method's stored form.
        L, k, _ = A.shape
        S, R, n = self.num_slots, lay.rank, len(Bs)
        A = A.reshape(L, k, n, S, R).transpose(0, 3, 1, 2, 4).reshape(L * S, k, n * R)
        A = jnp.pad(A, ((0, 0), (0, 0), (0, self.a_widths[leaf] - n * R)))
        store = jax.vmap(lay.a_method.process_weights_after_loading)
        return store(A), tuple(store(B.reshape(L * S, R, *B.shape[2:])) for B in Bs)

    def _write(self, slot: int, values: dict) -> None:
        """Writes one slot; the step then reads each weight in its method's stored form."""
        self._given, stored = self._set_slot(self._given, np.int32(slot), values)
        self.stacks = self._merged(self._given, stored)

    @staticmethod
    def _merged(given: dict, stored: dict) -> dict:
        """The stacks the step reads: each weight's stored form where its method has one, else the given."""
        return {leaf: (stored[leaf][0] if stored[leaf][0] is not None else A,
                       tuple(s if s is not None else B for s, B in zip(stored[leaf][1], Bs)))
                for leaf, (A, Bs) in given.items()}

    def add_requests(self, new_reqs) -> None:
        """Remember the adapters new requests (NewRequestData) name, by lora_int_id."""
        for new in new_reqs:
            if new.lora_request is not None:
                self.requests[new.lora_request.lora_int_id] = new.lora_request

    def step_inputs(self, token_lora_ids: np.ndarray, num_tokens: int) -> tuple[dict, np.ndarray]:
        """(stacks, i32[num_tokens] slot per token) for a step whose real tokens run with
        these adapter ids (0: none); a token without one, and the padding, in slot -1 (none)."""
        token_slots = np.full(num_tokens, -1, np.int32)
        ids = [int(i) for i in np.unique(token_lora_ids) if i]
        for lora_id in ids:  # the step's loaded adapters first: none of them is reused below
            if lora_id in self.slots:
                self.slots.move_to_end(lora_id)
        for lora_id in ids:
            token_slots[:len(token_lora_ids)][token_lora_ids == lora_id] = self._slot(lora_id)
        return self.stacks, token_slots

    def warmup_inputs(self, num_tokens: int) -> tuple[dict, np.ndarray]:
        return self.stacks, np.full(num_tokens, -1, np.int32)

    def _slot(self, lora_id: int) -> int:
        """The adapter's device slot, loading it into a free or the least recently used one."""
        if lora_id in self.slots:
            self.slots.move_to_end(lora_id)
            return self.slots[lora_id]
        slot = self.free_slots.pop() if self.free_slots else self.slots.pop(next(iter(self.slots)))
        self._write(slot, self._host_values(lora_id))
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
        the stacks: {leaf: (A [layers, in, parts * R], (B [layers, R, *out of the part], ...))}."""
        R, used, values = self.config.max_lora_rank, set(), {}
        for leaf, ws in self.targets.items():
            axis, bounds = self.bounds[leaf]
            As, Bs = [], []
            for w in ws:
                n = len(w.sources)
                a, parts = np.zeros((w.shape[0], n * R), np.float32), []
                for j, source in enumerate(w.sources):
                    b = np.zeros((self.out_sizes[_module(source)], R), np.float32)
                    if source in tensors:
                        A, B = tensors[source]
                        if A.shape[1] != a.shape[0] or B.shape[0] != b.shape[0]:
                            raise ValueError(f"LoRA weights of {source} have shapes {A.shape} and {B.shape}; "
                                             f"the model needs [r, {a.shape[0]}] and [{b.shape[0]}, r].")
                        a[:, j * R:j * R + A.shape[0]] = A.T
                        b[:, :A.shape[0]] = B
                        used.add(source)
                    parts.append(b)
                As.append(a)
                # The base's own fusing, rank in place of the in features; then each part's slice.
                fused = fit(w.key, w.transform(w.key, *parts), (R, *w.shape[1:]), np.float32)
                Bs.append([fused[(slice(None),) * (1 + axis) + (slice(lo, hi),)] for lo, hi in bounds])
            values[leaf] = (np.stack(As).astype(self.dtype),
                            tuple(np.stack(part).astype(self.dtype) for part in zip(*Bs)))
        unknown = sorted(set(tensors) - used)
        if unknown:
            raise ValueError(f"LoRA weights for {unknown[0]!r}: the model has no such projection.")
        return values
