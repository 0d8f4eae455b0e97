"""The engine core process's entry point (spawned by engine_core_handle). A module of its own, light
to import: the front end names this function to start the process, and must not load jax
or the model code for that (their import, and their teardown at exit, take seconds)."""
from __future__ import annotations

import logging
import os
import signal
import sys

import msgpack

from jaxvllm.platforms.device_sets import restrict_visible_devices
from jaxvllm.process_utils import init_child_process
from jaxvllm.serial_utils import decode, encode

logger = logging.getLogger(__name__)


def run_engine_core(args_bytes: bytes, input_address: str, output_address: str,
                    ready_pipe, parent_pid: int, device_set: tuple[int, int] | None = None) -> None:
    """Entry point of the engine process (started with the spawn method). The engine
    config is resolved here, where the devices are, and sent back with READY; the front
    end never initializes a device backend of its own (on a TPU it could not share it).
    A bad argument or model path is sent back as one line for the front end to report.
    device_set: (data-parallel rank, devices per rank), fixed before jax starts."""
    if not init_child_process(parent_pid):
        return
    # jaxvllm's own INFO lines; other libraries' only from WARNING (jax logs its probe of
    # every missing backend, "Unable to initialize backend 'tpu'", at INFO).
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("jaxvllm").setLevel(logging.INFO)

    def on_signal(signum, frame):
        raise SystemExit(0)

    engine = None
    try:
        if device_set is not None:
            try:
                restrict_visible_devices(*device_set)
            except ValueError as e:
                _send_failure(ready_pipe, e, invalid_argument=True)
                raise SystemExit(2) from None
        import jax

        from jaxvllm.config import EngineArgs
        from jaxvllm.engine.engine_core_proc import EngineCoreProc
        from jaxvllm.executor.multihost import initialize_distributed
        from jaxvllm.transformers_utils.config import load_hf_config
        from jaxvllm.transformers_utils.model_path import resolve_model
        try:
            args = decode(EngineArgs, args_bytes)
            model_path = resolve_model(args.model, args.revision, args.download_dir)
            hf_config = load_hf_config(model_path)
            initialize_distributed(args)  # multi-host: before the backend starts
            config = args.create_engine_config(hf_config, jax.default_backend(), model_path)
        except (ValueError, FileNotFoundError) as e:
            _send_failure(ready_pipe, e, invalid_argument=True)
            raise SystemExit(2) from None
        engine = EngineCoreProc(config, input_address, output_address)
        # Until now SIGTERM ended the process at once, even inside a compile (a Python
        # handler would wait for it); from here on it stops the busy loop cleanly.
        signal.signal(signal.SIGTERM, on_signal)
        ready_pipe.send_bytes(msgpack.packb({"status": "READY", "config": encode(config)}))
        engine.run_busy_loop()
    except SystemExit:
        pass
    except BaseException as e:
        logger.exception("EngineCore failed.")
        _send_failure(ready_pipe, e)
        try:
            if engine is not None:
                engine.shutdown()
        finally:
            _exit_now(1)
    finally:
        if engine is not None:
            engine.shutdown()
            _exit_now(0)


def _exit_now(code: int) -> None:
    """Once the engine is shut down, exit without the interpreter's teardown (jax's and
    Ray's: seconds, which the front end waits for before it fails requests or stops waiting
    and kills this process)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _send_failure(ready_pipe, error: BaseException, invalid_argument: bool = False) -> None:
    message = str(error) if invalid_argument else f"{type(error).__name__}: {error}"
    try:
        ready_pipe.send_bytes(msgpack.packb({"status": "FAILED", "error": message,
                                             "invalid_argument": invalid_argument}))
    except (OSError, ValueError):
        pass
