"""The one error hierarchy of continuum.

Every error continuum raises on purpose derives from :class:`ContinuumError`, carries the facts
as fields, and says in its message what to do next. Callers (CLI, server) map error *types* to
exit codes or HTTP statuses; they never match message text.

    ContinuumError
    ├── ModelFileError            a model file is missing, truncated or not GGUF   (path, problem)
    ├── ChatTemplateError         a chat format cannot render or split a conversation
    ├── InvalidRequest            the caller's input is malformed                   (ValueError)
    │   ├── InvalidMessage        one message is malformed                         (index, field)
    │   ├── BundleError           a session bundle cannot be imported; nothing was written
    │   │   ├── BundleCorrupt     truncated, damaged or malformed                       (problem)
    │   │   ├── BundleVersion     written in a bundle format this version does not read (version)
    │   │   ├── BundleModelMismatch  its session was made on another model      (model, served)
    │   │   └── BundleTenantMismatch it names another tenant than the importer's
    │   └── BackendConfigError    a backend option has a value it cannot take       (option, value)
    ├── ContextOverflow           the request cannot fit in the context     (n_requested, n_ctx)
    ├── SessionError
    │   ├── SessionNotFound       no session with that id in the store             (session_id)
    │   ├── SessionExists         a client-chosen id is taken already               (session_id)
    │   ├── SessionBusy           another thread is using the session               (session_id)
    │   ├── SessionQuotaExceeded  a tenant holds its limit of stored sessions      (tenant, limit)
    │   ├── TurnConflict          another process committed a turn of the session  (session_id,
    │   │                         expected, found)
    │   └── SessionClosed         the session or its worker was closed              (session_id)
    ├── BackendError              llama.cpp refused an operation (decode, state restore)
    │   ├── KVCacheFull           no free KV cells for a decode (evict cached prefixes, retry)
    │   ├── DecodeAborted         a decode ran past its deadline and was stopped  (n_tokens, n_past)
    │   └── ShuttingDown          the server is closing: work still running was stopped
    ├── SnapshotError             a KV snapshot is corrupt, truncated or incompatible
    ├── UnknownBackend            no backend registered under that name             (name)
    ├── UnknownModel              a request names a model this server does not serve (model)
    ├── Overloaded                the request queue is full; retry later      (retry_after_s)
    ├── Draining                  this worker is draining: it takes no new sessions
    ├── MetadataError             a cache metadata file is from another version or corrupt
    ├── StoreError                the history store cannot be read or written       (path)
    │   └── StoreUnavailable      the shared store (Redis) cannot be reached         (path)
    ├── MissingExtra              an optional dependency is not installed   (extra, pip command)
    └── EmbeddingError            an embedder cannot embed the input or is unreachable
"""

from __future__ import annotations

from pathlib import Path


class ContinuumError(Exception):
    """Base class of every error continuum raises on purpose."""


class ModelFileError(ContinuumError):
    """A model file is missing, truncated, unreadable or not a GGUF file."""

    def __init__(self, path: str | Path, problem: str, hint: str) -> None:
        self.path = str(path)
        self.problem = problem
        self.hint = hint
        super().__init__(f"model file {self.path}: {problem}. {hint}")


class ChatTemplateError(ContinuumError):
    """A chat format cannot render a conversation or cannot be split into per-message segments."""


class InvalidRequest(ContinuumError, ValueError):
    """The caller's input is malformed; nothing was changed."""


class InvalidMessage(InvalidRequest):
    """One message of a message list is malformed."""

    def __init__(self, index: int, field: str, problem: str) -> None:
        self.index = index
        self.field = field
        self.problem = problem
        super().__init__(
            f"message {index}: {field} {problem}. Send OpenAI-shaped messages: "
            "{'role': 'system'|'user'|'assistant'|'tool', 'content': str}."
        )


class BundleError(InvalidRequest):
    """A session bundle (``GET /v1/sessions/{id}/bundle``) cannot be imported; nothing of it
    was written."""


class BundleCorrupt(BundleError):
    """The bundle is truncated, damaged (its checksum fails) or not a bundle at all."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(
            f"the session bundle is unusable: {problem}. Export it again "
            "(GET /v1/sessions/{id}/bundle) and send its bytes unchanged"
        )


class BundleVersion(BundleError):
    """The bundle was written in a format this version of continuum does not read."""

    def __init__(self, version: object, supported: int) -> None:
        self.version = version
        self.supported = supported
        super().__init__(
            f"the session bundle is in format {version!r}; this continuum reads format "
            f"{supported}: export it again from a worker running this version, or upgrade"
        )


class BundleModelMismatch(BundleError):
    """The bundle's session was made on another model than this worker serves."""

    def __init__(self, model: str, served: str) -> None:
        self.model = model
        self.served = served
        super().__init__(
            f"the bundle's session was made on model {model}, and this worker serves "
            f"{served}: import it on a worker serving that model"
        )


class BundleTenantMismatch(BundleError):
    """The bundle's session belongs to another tenant than the one importing it."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        super().__init__(
            f"the bundle's session belongs to another tenant than {tenant!r} (the one your "
            "credentials name): import it with the API key of the tenant that exported it"
        )


class BackendConfigError(InvalidRequest):
    """A backend option has a value the backend cannot take; nothing was opened."""

    def __init__(self, option: str, value: object, hint: str) -> None:
        self.option = option
        self.value = value
        super().__init__(f"backend option {option}={value!r}: {hint}")


class ContextOverflow(ContinuumError):
    """The request needs more tokens than the context can hold, even after a rebuild.

    The message opens as OpenAI's does ("This model's maximum context length is N tokens"), and
    the server sends it with code ``context_length_exceeded``: agent frameworks that compact a
    conversation on that error recognise it."""

    def __init__(self, n_requested: int, n_ctx: int, what: str = "the request") -> None:
        self.n_requested = n_requested
        self.n_ctx = n_ctx
        super().__init__(
            f"This model's maximum context length is {n_ctx} tokens, but {what} needs "
            f"{n_requested} tokens. Shorten the input, lower max_tokens, or raise n_ctx."
        )


class SessionError(ContinuumError):
    """Base class of errors about one session."""

    def __init__(self, session_id: str, message: str) -> None:
        self.session_id = session_id
        super().__init__(message)


class SessionNotFound(SessionError):
    def __init__(self, session_id: str) -> None:
        super().__init__(
            session_id,
            f"no session {session_id!r} in the history store; create one, or check the store path",
        )


class SessionExists(SessionError):
    def __init__(self, session_id: str) -> None:
        super().__init__(
            session_id,
            f"a session with id {session_id!r} exists already; choose another id, or omit it "
            "to have one generated",
        )


class SessionQuotaExceeded(SessionError):
    """A tenant already stores as many sessions as the server allows it."""

    def __init__(self, tenant: str, limit: int) -> None:
        self.tenant, self.limit = tenant, limit
        super().__init__(
            "",
            f"this tenant stores {limit} sessions, its limit: delete ones it no longer needs "
            "(DELETE /v1/sessions/{id}), or ask the operator to raise --max-sessions",
        )


class TurnConflict(SessionError):
    """Two processes on one history store ran a turn of the same session: the later commit
    finds a turn it did not expect, and nothing of it is written."""

    def __init__(self, session_id: str, expected: int, found: int) -> None:
        self.expected = expected
        self.found = found
        super().__init__(
            session_id,
            f"session {session_id!r} was changed by another process (its last turn is {found}, "
            f"this one expected {expected}); nothing was written: reopen the session and send "
            "the turn again",
        )


class SessionBusy(SessionError):
    def __init__(self, session_id: str) -> None:
        super().__init__(
            session_id,
            f"session {session_id!r} is already running a turn in another thread; "
            "wait for it to finish (one turn at a time per session)",
        )


class SessionClosed(SessionError):
    def __init__(self, session_id: str) -> None:
        super().__init__(
            session_id, f"session {session_id!r} is closed; reopen it by id from its worker"
        )


class BackendError(ContinuumError):
    """llama.cpp refused an operation (decode, state save/restore)."""


class KVCacheFull(BackendError):
    """llama.cpp found no free KV cells for a batch."""


class DecodeAborted(BackendError):
    """A decode given a deadline ran past it; llama.cpp stopped, the sequence is unchanged."""

    def __init__(self, n_tokens: int, n_past: int) -> None:
        self.n_tokens = n_tokens
        self.n_past = n_past
        super().__init__(
            f"the decode of {n_tokens} tokens at position {n_past} ran past its deadline and "
            "was stopped; nothing of it stays resident (give it more time or fewer tokens)"
        )


class ShuttingDown(BackendError):
    """The server is closing: a job still queued, or still decoding after the grace period, was
    stopped before it finished. Nothing of it was committed."""

    def __init__(self) -> None:
        super().__init__(
            "the server is shutting down and stopped this request before it finished (nothing "
            "of it was committed); retry it: another worker or the restarted server answers"
        )


class SnapshotError(ContinuumError):
    """A KV snapshot is corrupt, truncated or was made for another model or context."""


class UnknownBackend(ContinuumError):
    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        super().__init__(
            f"no backend named {name!r}; registered: {', '.join(known) or 'none'}. "
            "Install the package that provides it, or register it with BackendRegistry.register"
        )


class UnknownModel(ContinuumError):
    def __init__(self, model: str, available: list[str]) -> None:
        self.model = model
        super().__init__(
            f"model {model!r} is not served here; use one of: {', '.join(available)} "
            "(GET /v1/models lists them)"
        )


class Overloaded(ContinuumError):
    """The bounded request queue is full."""

    def __init__(self, retry_after_s: int, depth: int) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(
            f"the server is busy ({depth} requests queued); retry after {retry_after_s} s"
        )


class Draining(ContinuumError):
    """The worker is draining (``POST /admin/drain``): its sessions are parked in the shared
    store for another worker, and it takes no new ones."""

    def __init__(self) -> None:
        super().__init__(
            "this worker is draining and takes no new sessions; retry: the router sends the "
            "request to another worker"
        )


class MetadataError(ContinuumError):
    """A cache metadata file cannot be used (other version, corrupt, unreadable)."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        super().__init__(
            f"cache metadata {self.path}: {problem}. Delete it or save it again with this version"
        )


class StoreError(ContinuumError):
    """The history store cannot be opened, read or written."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        super().__init__(f"history store {self.path}: {problem}")


class StoreUnavailable(StoreError):
    """The shared store (Redis) cannot be reached; nothing was read or written. The history is
    authoritative, so a session request fails (503) rather than fall back to local state."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(
            path, f"unreachable ({problem}); start Redis or point --store at a running one"
        )


class MissingExtra(ContinuumError):
    """A feature needs an optional dependency group that is not installed."""

    def __init__(self, feature: str, extra: str, missing: str) -> None:
        self.feature = feature
        self.extra = extra
        self.missing = missing
        self.pip_command = f"pip install 'continuum[{extra}]'"
        super().__init__(
            f"{feature} needs the {missing!r} package, which is not installed. "
            f"Install the extra: {self.pip_command}"
        )


class EmbeddingError(ContinuumError):
    """An embedder cannot embed the input (empty, not text) or its endpoint failed."""
