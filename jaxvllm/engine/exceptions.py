"""Errors the front end raises when the engine core cannot serve a request."""
from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The engine-core process is gone; every pending and future request fails with this."""

    def __init__(self, message: str = "The engine core process died unexpectedly; see its log "
                                      "above for the cause. Restart the engine to continue."):
        super().__init__(message)


class EngineGenerateError(RuntimeError):
    """A request failed inside the engine while others kept running."""

    def __init__(self, message: str):
        super().__init__(message)


class EngineSleepingError(RuntimeError):
    """The engine is asleep (LLM.sleep, POST /sleep): it takes requests again after wake_up."""

    def __init__(self, message: str = "The engine is sleeping; wake it up (LLM.wake_up, "
                                      "POST /wake_up) to serve requests."):
        super().__init__(message)
