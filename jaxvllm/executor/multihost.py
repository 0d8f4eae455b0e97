"""Multi-host serving: one process per host, one global mesh, one scheduler.

Every process runs the same jitted step on the global mesh (JAX's multi-controller SPMD),
so every process must feed it the same step. Only process 0 (node_rank 0) schedules: its
EngineCore publishes each SchedulerOutput over ZMQ (msgpack, no pickle) and the other
processes (`run_follower`) replay it through their own ModelRunner, which keeps its request
state from SchedulerOutputs alone. The coordinator (master_addr:master_port) is
jax.distributed's; the broadcast uses the next port.
"""
from __future__ import annotations

import atexit
import logging

import jax
import zmq

from jaxvllm.config import EngineArgs, ParallelConfig
from jaxvllm.core.kv_cache_interface import KVCacheConfig
from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.serial_utils import decode, encode

logger = logging.getLogger(__name__)
_KV_CACHE_CONFIG, _STEP, _STOP = b"B", b"S", b"X"


def initialize_distributed(args: EngineArgs) -> None:
    """jax.distributed.initialize for nnodes > 1, before any backend is touched. Without
    master_addr, jax finds the coordinator itself (Cloud TPU metadata, SLURM, ...)."""
    if args.nnodes <= 1 or jax.distributed.is_initialized():
        return
    if not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"node_rank must be in [0, nnodes={args.nnodes}), got {args.node_rank}.")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU meshes across processes
    jax.distributed.initialize(
        coordinator_address=f"{args.master_addr}:{args.master_port}" if args.master_addr else None,
        num_processes=args.nnodes, process_id=args.node_rank)
    logger.info("jax.distributed: process %d of %d, %d local / %d global devices.",
                jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())


class SchedulerOutputBroadcaster:
    """Process 0's side: an XPUB socket that first waits until every follower has
    subscribed (a plain PUB would silently drop what is sent before that)."""

    def __init__(self, parallel: ParallelConfig, timeout_s: float = 300.0):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.sock.setsockopt(zmq.LINGER, 5000)
        self.sock.bind(f"tcp://*:{parallel.master_port + 1}")
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        for _ in range(parallel.nnodes - 1):
            if not poller.poll(timeout_s * 1000):
                raise TimeoutError(f"Not all {parallel.nnodes - 1} follower processes connected to "
                                   f"port {parallel.master_port + 1} within {timeout_s} s.")
            self.sock.recv()  # a subscription message
        atexit.register(self.close)  # followers must not wait forever on a vanished process 0

    def send_kv_cache_config(self, kv_cache_config: KVCacheConfig) -> None:
        self.sock.send_multipart([_KV_CACHE_CONFIG, encode(kv_cache_config)])

    def send(self, scheduler_output: SchedulerOutput) -> None:
        self.sock.send_multipart([_STEP, encode(scheduler_output)])

    def close(self) -> None:
        if self.sock.closed:
            return
        self.sock.send_multipart([_STOP, b""])
        self.sock.close()
        self.ctx.term()


class SchedulerOutputReceiver:
    def __init__(self, parallel: ParallelConfig):
        if not parallel.master_addr:
            raise ValueError("master_addr must be set on node_rank > 0 (the address of node_rank 0).")
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(f"tcp://{parallel.master_addr}:{parallel.master_port + 1}")

    def recv(self) -> tuple[bytes, bytes]:
        kind, payload = self.sock.recv_multipart()
        return kind, payload

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def run_follower(args: EngineArgs) -> None:
    """The whole life of a node_rank > 0 process: build the same worker, take the KV cache
    size from process 0, then run each broadcast step until process 0 stops."""
    from jaxvllm.transformers_utils.config import load_hf_config
    from jaxvllm.transformers_utils.model_path import resolve_model
    from jaxvllm.worker.worker import Worker

    initialize_distributed(args)
    model_path = resolve_model(args.model, args.revision, args.download_dir)
    hf_config = load_hf_config(model_path)
    config = args.create_engine_config(hf_config, jax.default_backend(), model_path)
    receiver = SchedulerOutputReceiver(config.parallel)
    worker = Worker(config)
    try:
        kind, payload = receiver.recv()
        if kind != _KV_CACHE_CONFIG:
            raise RuntimeError(f"Expected the KV cache size from process 0, got message {kind!r}.")
        runner = worker.initialize_from_config(decode(KVCacheConfig, payload))
        while True:
            kind, payload = receiver.recv()
            if kind == _STOP:
                return
            runner.execute_model(decode(SchedulerOutput, payload))
    finally:
        receiver.close()
