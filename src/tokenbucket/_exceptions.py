"""The tokenbucket exception family.

Every error the library raises on purpose derives from :class:`TokenbucketError`, so a caller
can catch them all in one place and still tell them apart::

    TokenbucketError
     ├── ConfigError            a spec or option is invalid (names the field and the value)
     │    ├── StateError            a saved sampler / stream / monitor state that cannot be resumed here
     │    └── UsageError            command-line flags that do not go together (exit status 2)
     ├── PlanError              the plan and the budget disagree
     │    └── OversizeError         a sample does not fit the budget even alone
     ├── OOMRiskError           a batch predicted above the risk threshold (``on_risk="raise"``)
     └── MetadataError          a metadata row is invalid (names row, key, column and value)
          ├── MissingColumnError    a required column is absent from the table
          ├── InvalidValueError     null, NaN, negative, non-integer or out-of-range value
          ├── DuplicateKeyError     a key already used by an earlier row
          └── ImageTooSmallError    under ``resize="crop"`` the image holds no whole patch

Warnings: :class:`OOMRiskWarning` (a risky batch, a batch size lowered after an OOM) and
:class:`PlanDriftWarning` (measured memory above the plan's prediction);
:class:`ManifestMismatchWarning` (a manifest used with another token spec or model than it was
planned for, when the caller allowed it).

``ConfigError`` and ``MetadataError`` are also ``ValueError``s, so code that already catches
``ValueError`` keeps working.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DuplicateKeyError",
    "ImageTooSmallError",
    "InvalidValueError",
    "ManifestMismatchWarning",
    "MetadataError",
    "MissingColumnError",
    "OOMRiskError",
    "OversizeError",
    "OOMRiskWarning",
    "PlanDriftWarning",
    "PlanError",
    "StateError",
    "TokenbucketError",
    "UsageError",
]


class TokenbucketError(Exception):
    """Base class of every error raised by tokenbucket."""


class ConfigError(TokenbucketError, ValueError):
    """An invalid spec, option or config file entry."""


class UsageError(ConfigError):
    """Flags that do not go together, or one missing (the command line's exit status 2)."""


class PlanError(TokenbucketError, ValueError):
    """A plan that does not hold under its budget, or a budget no plan can meet."""


class OversizeError(PlanError):
    """Samples that do not fit the budget even alone (with ``on_oversize="error"``).

    The message names the way out as a Python caller writes it (:attr:`REJECT`); a front end
    with its own spelling, such as the command line's ``--on-oversize reject``, says that
    instead with :meth:`worded`.
    """

    REJECT = "on_oversize='reject'"

    def worded(self, reject: str) -> str:
        """The message with ``reject`` in place of :attr:`REJECT`."""
        return str(self).replace(self.REJECT, reject)


class StateError(ConfigError):
    """A saved state (a sampler's or a stream's) that does not match what it is loaded into."""


class OOMRiskError(TokenbucketError):
    """A batch whose predicted peak is above the risk threshold, refused before it reaches the GPU."""


class OOMRiskWarning(UserWarning):
    """A batch predicted above the risk threshold (``on_risk="warn"``), or a batch size lowered after an OOM."""


class PlanDriftWarning(UserWarning):
    """Measured peaks have risen past the predicted ones by more than the monitor's margin."""


class MetadataError(TokenbucketError, ValueError):
    """An invalid metadata row.

    Attributes:
        row: 0-based index of the row in the input (``None`` for a single sample or a whole
            column).
        key: the row's key, when known.
        column: the offending column (``cameras[1].height`` for a per-camera field).
        value: the offending value, as read.
        reason: the short reason, without the location (what a rejected table stores).
    """

    def __init__(
        self,
        reason: str,
        *,
        column: str,
        row: int | None = None,
        key: str | None = None,
        value: object = None,
    ) -> None:
        self.reason = reason
        self.column = column
        self.row = row
        self.key = key
        self.value = value
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.key is not None:
            where.append(f"key {self.key!r}")
        location = f"{' '.join(where)}: " if where else ""
        return f"{location}column {self.column!r} {self.reason}, but got {self.column}={self.value!r}"


class MissingColumnError(MetadataError):
    """A required column is absent from the metadata."""

    def __init__(self, column: str, available: list[str]) -> None:
        self.available = available
        super().__init__("is required", column=column, value=None)

    def _format(self) -> str:
        return (
            f"column {self.column!r} is required but missing; the metadata has columns "
            f"{self.available}. Rename it, or map it with ColumnMap({self.column}=...)"
        )


class InvalidValueError(MetadataError):
    """A null, NaN, negative, non-integer or out-of-range value."""


class DuplicateKeyError(MetadataError):
    """A key that an earlier row already uses; keys must be unique."""


class ImageTooSmallError(MetadataError):
    """Under ``resize="crop"`` the image is smaller than one (merged) patch."""


class ManifestMismatchWarning(UserWarning):
    """A manifest used with another token spec or model than it was planned for (``allow_mismatch=True``)."""
