"""Sleep mode's one state machine, as the front end sees the engine:

    AWAKE --sleep--> FALLING_ASLEEP --ok--> ASLEEP --wake_up--> WAKING --ok--> AWAKE
                           |--refused--> AWAKE          |--partly/failed--> ASLEEP

Requests are admitted only while AWAKE, and the front end checks it twice: on arrival and
again just before the request is sent to the engine core (tokenizing ran in between). The
core is the authority (EngineCore.sleeping_tags); a request that reaches a sleeping core
anyway is refused there with the same EngineSleepingError, and the server answers both
with 503. Sleep and wake-up calls are serialized, so a transition never interleaves
with another.
"""
from __future__ import annotations

import enum

from jaxvllm.engine.exceptions import EngineSleepingError
from jaxvllm.sampling_params import is_int


class SleepStage(enum.Enum):
    AWAKE = "awake"
    FALLING_ASLEEP = "falling_asleep"
    ASLEEP = "asleep"
    WAKING = "waking"


def check_sleep_level(level) -> int:
    if not is_int(level) or level not in (1, 2):
        raise ValueError(f"sleep level must be 1 or 2, got {str(level)[:20]!r}.")
    return level


class SleepState:
    def __init__(self):
        self.stage = SleepStage.AWAKE

    @property
    def admits(self) -> bool:
        return self.stage is SleepStage.AWAKE

    def check_admits(self) -> None:
        if not self.admits:
            raise EngineSleepingError()

    def begin_sleep(self) -> SleepStage:
        """Returns the stage before (where a refused transition goes back to)."""
        before, self.stage = self.stage, SleepStage.FALLING_ASLEEP
        return before

    def begin_wake_up(self) -> SleepStage:
        before, self.stage = self.stage, SleepStage.WAKING
        return before

    def settle(self, asleep: bool) -> None:
        """Where the engine says it is (after a transition, a refusal or a weight update)."""
        self.stage = SleepStage.ASLEEP if asleep else SleepStage.AWAKE
