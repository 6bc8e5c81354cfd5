"""What the shared tier's parts (:mod:`.writer`, :mod:`.flight`) see of the machinery that holds
them (:class:`.shared.SharedTier`): declared here, so that they import neither it nor each other."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from ...counters import Counters
    from ..records import Record
    from .backend import Backend, TierConfig
    from .breaker import Breaker
    from .lease import FruitlessBudget, LockKeeper

T = TypeVar("T")


class Failed:
    """What a call that failed (or was skipped) returns."""

    def __repr__(self) -> str:
        return "FAIL"


FAIL = Failed()


class Core(Protocol):
    backend: Backend
    counts: Counters
    keeper: LockKeeper
    fruitless: FruitlessBudget

    @property
    def cfg(self) -> TierConfig: ...

    def ready(self) -> bool:
        """The backend is open (False: it cannot be, or the tier is closing)."""

    def call(
        self,
        kind: str,
        fn: Callable[[], T],
        *,
        ident: str = "",
        seconds: float | None = None,
        max_bytes: int = ...,
        timed: bool = True,
        caller: bool = True,
    ) -> T | Failed:
        """``fn()`` bounded, counted, behind the breakers and the budget; :data:`FAIL` when not done."""

    def admit(self, ident: str, writer: bool = False) -> Breaker | None: ...

    def failed(
        self, kind: str, e: BaseException, n: int = 1, breaker: Breaker | None = None, took: float = 0.0
    ) -> None: ...

    def answered(self, e: BaseException, breaker: Breaker | None = None, took: float = 0.0) -> None:
        """A call answered with an error: counted towards the tier's streak of them, time charged."""

    def succeeded(self, breaker: Breaker) -> None:
        """A call the backend did: its node's breaker closes, the streak of error answers ends."""

    def transfer_s(self, nbytes: int, floor: float | None = None) -> float: ...

    def read_value(
        self, kind: str, key: str, ident: str, size: int
    ) -> tuple[Record, dict[str, bytes]] | None: ...

    def unlock(self, ident: str) -> None: ...
