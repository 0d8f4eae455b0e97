"""JaxTransferConnector, worker side: the prompt pages a prefill engine sends and a decode
engine pulls, device to device through `jax.experimental.transfer` (the scheduler side,
which decides them, is jax_transfer_connector.py). The transfer library serves TPU, GPU and
the CPU alike (here on the CPU, between processes as within one), so there is no second
transport.

Sending: after the forward that completes a prefill request's prompt, its pages (every
group's, as whole rows of the cache) are gathered on device into chunks of at most
CHUNK_BLOCKS, a copy the pool no longer holds, and kept for `send_timeout_s` under a random
transfer id. A side channel (ZeroMQ REQ/REP, msgpack) at kv_ip:kv_port answers a decode
engine's ask for that id: the transfer server then offers the chunks for one pull, and the
reply says where and in which shapes. An id nobody asks for expires, its copy dropped. Each
copy handed to a pull or dropped is reported (`finished_sending`), so that the scheduler
admits the next prefill within the memory plan's `num_send_blocks`.

Receiving: a background thread asks the side channel and starts the pull; each step
checks, without blocking, whether the pulled chunks have landed, scatters them into the
request's pages before the forward, and reports the request. A prefill engine that is gone
is found out at once, before the ask and every ALIVE_CHECK_S while it waits for the answer:
its port refuses the connection (or, for a host that does not answer, within
CONNECT_TIMEOUT_S), where ZeroMQ would retry it silently. A side channel that does not
answer, an unknown id, a pull that errors or that does not land within `pull_timeout_s`
fails the load too: its pages are reported invalid and computed again.
"""
from __future__ import annotations

import logging
import socket as tcp
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import msgpack
import numpy as np
import zmq
from jax.experimental import transfer

from jaxvllm.kv_transfer.base import KVConnectorBase_V1
from jaxvllm.kv_transfer.jax_transfer_connector import (
    CHUNK_BLOCKS,
    SENDS,
    JaxTransferConnectorMetadata,
    num_send_blocks,
)
from jaxvllm.worker.kv_block_copy import KVBlockCopier

logger = logging.getLogger(__name__)
DEFAULT_PULL_TIMEOUT_S, DEFAULT_SEND_TIMEOUT_S = 3.0, 120.0
CONNECT_TIMEOUT_S, ALIVE_CHECK_S = 1.0, 0.25


class JaxTransferConnectorWorker(KVConnectorBase_V1):
    metadata_cls = JaxTransferConnectorMetadata
    def __init__(self, config, role, kv_cache_config):
        super().__init__(config, role, kv_cache_config)
        kv = config.kv_transfer
        extra = kv.kv_connector_extra_config
        self.pull_timeout_s = extra.get("pull_timeout_s", DEFAULT_PULL_TIMEOUT_S)
        self.send_timeout_s = extra.get("send_timeout_s", DEFAULT_SEND_TIMEOUT_S)
        self.block_size = kv_cache_config.block_size
        self._sends: dict[int, tuple[list[jax.Array], int, float, str]] = {}  # id -> (chunks, blocks, expiry, request)
        self._released: set[str] = set()  # requests whose copy was handed to a pull or dropped
        self._lock = threading.Lock()
        self._loads: dict[str, tuple] = {}  # request -> (RemoteLoad, future of the pulled chunks, deadline)
        self._finished: set[str] = set()
        self._invalid: set[int] = set()
        self._connections: dict[str, object] = {}
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="kv-pull")
        self._stop = threading.Event()
        self.stats = {"kv_transfer_sent_requests": 0, "kv_transfer_sent_bytes": 0, "kv_transfer_expired_sends": 0,
                      "kv_transfer_received_requests": 0, "kv_transfer_received_bytes": 0,
                      "kv_transfer_failed_receives": 0, "kv_transfer_receive_time": 0.0}
        self._serve_sends = kv.kv_role in SENDS
        self._address = f"{kv.kv_ip}:{kv.kv_port}"
        self._side_thread = None

    @classmethod
    def reserved_device_bytes(cls, config, block_bytes: int) -> int:
        """A prefill engine's copies awaiting a pull: num_send_blocks rows beside the pool."""
        return num_send_blocks(config) * block_bytes if config.kv_transfer.kv_role in SENDS else 0

    def register_kv_caches(self, kv_cache: jax.Array, on_compile) -> None:
        self.copier = KVBlockCopier(kv_cache, CHUNK_BLOCKS, on_compile)
        self._row_sharding = self.copier.gather(kv_cache, [0]).sharding  # what pulled chunks land as
        ip = self._address.rpartition(":")[0]
        client = next(iter(kv_cache.sharding.device_set)).client
        self.server = transfer.start_transfer_server(client, f"{ip}:0", [f"{ip}:0"])
        self._zmq = zmq.Context.instance()
        if self._serve_sends:
            socket = self._zmq.socket(zmq.REP)
            socket.setsockopt(zmq.LINGER, 0)
            try:  # before the engine is up: a taken port fails the start
                socket.bind(f"tcp://{self._address}")
            except zmq.ZMQError as e:
                socket.close()
                raise ValueError(f"kv_transfer_config.kv_ip:kv_port {self._address} cannot take the prefill "
                                 f"engine's side channel ({e}); give each prefill engine its own kv_port.") from e
            self._side_thread = threading.Thread(target=self._side_channel, args=(socket,), name="kv-side-channel",
                                                 daemon=True)
            self._side_thread.start()

    def warmup(self, kv_cache: jax.Array) -> jax.Array:
        return self.copier.warmup(kv_cache)

    # ---- sending (prefill engine) -----------------------------------------------------
    def wait_for_save(self, kv_cache: jax.Array) -> None:
        """Gather the prompts this step completed; drop the sends nobody pulled in time."""
        meta, now = self._metadata, time.monotonic()
        for req_id, transfer_id, tables in meta.sends if meta is not None else ():
            ids = [b for table in tables for b in table]
            chunks = [self.copier.gather(kv_cache, chunk) for chunk in self.copier.chunks(ids)]
            with self._lock:
                self._sends[transfer_id] = (chunks, len(ids), now + self.send_timeout_s, req_id)
        with self._lock:
            for transfer_id in [t for t, (_, _, expiry, _) in self._sends.items() if expiry < now]:
                self._released.add(self._sends.pop(transfer_id)[3])
                self.stats["kv_transfer_expired_sends"] += 1
        if meta is not None and meta.idle and self._sends:  # prefills wait for a pull: no busy loop
            time.sleep(0.002)

    def _side_channel(self, socket) -> None:
        """Answer each ask for a transfer id: offer its chunks to one pull, say where."""
        while not self._stop.is_set():
            if not socket.poll(100):
                continue
            if self._stop.is_set():
                break
            try:
                transfer_id = msgpack.unpackb(socket.recv())["transfer_id"]
            except Exception:  # a REP socket answers every message, even one that is not ours
                socket.send(msgpack.packb({"error": "expected a msgpack map with transfer_id"}))
                continue
            with self._lock:
                entry = self._sends.pop(transfer_id, None)
            if entry is None:
                socket.send(msgpack.packb({"error": f"no KV to send under transfer id {transfer_id} "
                                                    f"(never computed here, already pulled, or expired)"}))
                continue
            chunks, num_blocks, _, req_id = entry
            self.server.await_pull(transfer_id, chunks)
            with self._lock:
                self._released.add(req_id)
                self.stats["kv_transfer_sent_requests"] += 1
                self.stats["kv_transfer_sent_bytes"] += num_blocks * self.copier.row_bytes
            socket.send(msgpack.packb({"address": self.server.address(), "block_size": self.block_size,
                                       "dtype": str(self.copier.dtype), "shapes": [list(c.shape) for c in chunks]}))
        socket.close()

    # ---- receiving (decode engine) ----------------------------------------------------
    def start_load_kv(self, kv_cache: jax.Array) -> jax.Array:
        """Start this step's pulls; scatter the ones that landed (or fail them)."""
        meta = self._metadata
        if meta is None:
            return kv_cache
        for req_id in meta.cancels:
            self._loads.pop(req_id, None)
        now = time.monotonic()
        for load in meta.loads:
            self._loads[load.req_id] = (load, self._pool.submit(self._pull, load), now + self.pull_timeout_s, now)
        if meta.idle and self._loads:  # nothing else to do: give the pulls a moment, not a busy loop
            time.sleep(0.002)
        for req_id, (load, future, deadline, started) in list(self._loads.items()):
            if future.done() and future.exception() is None and all(c.is_ready() for c in future.result()):
                try:
                    kv_cache = self._scatter(kv_cache, load, future.result())
                except Exception as e:  # the prefill engine's side failed mid-transfer
                    self._fail(load, e, started)
                else:
                    self.stats["kv_transfer_received_requests"] += 1
                    self.stats["kv_transfer_receive_time"] += time.monotonic() - started
            elif future.done() and future.exception() is not None:
                self._fail(load, future.exception(), started)
            elif time.monotonic() > deadline:
                self._fail(load, TimeoutError(f"no KV within pull_timeout_s={self.pull_timeout_s}"), started)
            else:
                continue
            del self._loads[req_id]
            self._finished.add(req_id)
        return kv_cache

    def _targets(self, load) -> list[int]:
        """The prompt's pages in the sender's order; the local prefix hit's go to the null
        block 0 (already computed here, and never read there)."""
        return [b if i >= load.start_block else 0 for table in load.block_ids for i, b in enumerate(table)]

    def _pull(self, load) -> list[jax.Array]:
        """Ask the prefill engine's side channel, then start the pull (it lands later)."""
        self._check_alive(load)
        socket = self._zmq.socket(zmq.REQ)
        socket.setsockopt(zmq.LINGER, 0)
        try:
            socket.connect(f"tcp://{load.host}:{load.port}")
            socket.send(msgpack.packb({"transfer_id": load.transfer_id}))
            deadline = time.monotonic() + self.pull_timeout_s
            while not socket.poll(int(1000 * ALIVE_CHECK_S)):  # a peer that dies meanwhile, found out
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the prefill engine at {load.host}:{load.port} did not answer")
                self._check_alive(load)
            reply = msgpack.unpackb(socket.recv())
        finally:
            socket.close()
        if "error" in reply:
            raise RuntimeError(reply["error"])
        chunks = self.copier.chunks(self._targets(load))
        ours = [[self.copier.padded_len(len(c))] + list(self.copier.row_shape) for c in chunks]
        if (reply["shapes"], reply["block_size"], reply["dtype"]) != (ours, self.block_size, str(self.copier.dtype)):
            raise ValueError(f"the prefill engine sends chunks {reply['shapes']} of {reply['block_size']}-token "
                             f"blocks in {reply['dtype']}; this engine's KV cache needs {ours} of "
                             f"{self.block_size} in {self.copier.dtype}")
        with self._lock:
            if (conn := self._connections.get(reply["address"])) is None:
                conn = self._connections[reply["address"]] = self.server.connect(reply["address"])
        specs = [jax.ShapeDtypeStruct(tuple(s), np.dtype(reply["dtype"]), sharding=self._row_sharding)
                 for s in reply["shapes"]]
        return conn.pull(load.transfer_id, specs)

    @staticmethod
    def _check_alive(load) -> None:
        """ConnectionError when nothing listens at the prefill engine's side channel any more:
        ZeroMQ would retry such a peer quietly until pull_timeout_s."""
        try:
            tcp.create_connection((load.host, load.port), CONNECT_TIMEOUT_S).close()
        except OSError as e:
            raise ConnectionError(f"the prefill engine at {load.host}:{load.port} is gone ({e})") from None

    def _scatter(self, kv_cache: jax.Array, load, chunks: list[jax.Array]) -> jax.Array:
        for rows in chunks:  # every chunk checked before the first write (the cache is donated)
            rows.block_until_ready()  # landed already; raises if the transfer failed
        for ids, rows in zip(self.copier.chunks(self._targets(load)), chunks):
            kv_cache = self.copier.scatter_rows(kv_cache, ids, rows)
            self.stats["kv_transfer_received_bytes"] += len(ids) * self.copier.row_bytes
        return kv_cache

    def _fail(self, load, error: Exception, started: float) -> None:
        logger.warning("KV for request %s not received after %.2f s (%s): computing its prompt here.", load.req_id,
                       time.monotonic() - started, error)
        self._invalid.update(b for table in load.block_ids for b in table[load.start_block:])
        self.stats["kv_transfer_failed_receives"] += 1

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        """(requests whose copy was pulled or dropped, requests whose load ended)."""
        finished, self._finished = self._finished, set()
        with self._lock:
            released, self._released = self._released, set()
        return released, finished

    def get_block_ids_with_load_errors(self) -> set[int]:
        invalid, self._invalid = self._invalid, set()
        return invalid

    def get_kv_connector_stats(self) -> dict[str, float]:
        with self._lock:
            return dict(self.stats)

    def shutdown(self) -> None:
        """Stop answering (the side channel's port is free once its thread has left)."""
        self._stop.set()
        if self._side_thread is not None:
            self._side_thread.join()
        self._pool.shutdown(wait=False, cancel_futures=True)
