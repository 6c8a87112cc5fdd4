"""The exceptions unimatmul raises, each carrying the object that caused it."""

from __future__ import annotations

from typing import Any


class UnimatmulError(Exception):
    """Base class of every error unimatmul raises on purpose."""


class UnsupportedProblem(UnimatmulError):
    """A backend cannot run this Problem (or this Candidate on it).

    This is the protocol's "no": the selector moves on to the next backend or to
    Default. It is never a crash.
    """

    def __init__(self, msg: str, *, problem: Any = None, backend: str | None = None) -> None:
        super().__init__(msg)
        self.problem = problem
        self.backend = backend


class NotReady(UnsupportedProblem):
    """A candidate's kernel was not ready (compiled, built) by the time its problem's
    tuning cap allows (:func:`unimatmul.backend.prepare_deadline`): the harness leaves
    the candidate out as capped, not as failed."""


class BackendUnavailable(UnimatmulError):
    """A backend's vendor library is missing or failed to load."""

    def __init__(self, msg: str, *, backend: str | None = None) -> None:
        super().__init__(msg)
        self.backend = backend


class UnknownCandidate(UnimatmulError, LookupError):
    """A Candidate identity names no kernel the backend offers now."""

    def __init__(self, msg: str, *, identity: str | None = None) -> None:
        super().__init__(msg)
        self.identity = identity


class PluginError(UnimatmulError):
    """A plugin failed to load or registered something invalid; names the plugin."""

    def __init__(self, msg: str, *, plugin: str | None = None) -> None:
        super().__init__(msg)
        self.plugin = plugin


class DefaultFailed(UnimatmulError, RuntimeError):
    """The caller's own library (Default, the only kernel unimatmul can fall back to) failed
    on a call; the message names the library call and why, the cause is its error."""

    def __init__(self, msg: str, *, call: str | None = None) -> None:
        super().__init__(msg)
        self.call = call


class CommandError(UnimatmulError):
    """A ``unimatmul`` command cannot do what it was asked: a message for the user and the
    exit code to end with (2: bad usage or input; see ``unimatmul.cli.output``)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class MissingDependency(UnimatmulError, ImportError):
    """A feature needs a package that is not installed; the message says what to install.

    An ImportError (``except ImportError`` catches it), naming the missing module."""

    def __init__(self, msg: str, *, name: str | None = None) -> None:
        super().__init__(msg)
        self.name = name
