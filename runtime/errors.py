"""What went wrong, in one line a user can act on.

Spark, delta-rs and Kafka report their failures wrapped: a Py4J call (``An error occurred while
calling o182.getResult``) around the Java exception around, sometimes, a Python traceback from a
task. :func:`reason_of` digs out the line that names the cause (``Job aborted due to stage
failure: Total size of serialized results ... is bigger than spark.driver.maxResultSize``) so
that a command's ``error:`` line and a job's log say it, not the wrapper's.
"""

from __future__ import annotations

import re
import sys
from typing import Final

# A Python exception line inside a text (a task's traceback, a foreachBatch function's).
_PYTHON_ERROR: Final = re.compile(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$", re.MULTILINE)
# A Java exception line: Py4J's ": org.apache...SparkException: message", a "Caused by:" line,
# or a Java exception's own first line; the class name is qualified (it has dots).
_JAVA_ERROR: Final = re.compile(
    r"^(?:: |Caused by: )?((?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Exception|Error|Failure)))"
    r"(?:: (.*))?$",
    re.MULTILINE,
)
# Wrappers: they say that something failed, not what.
_WRAPPERS: Final = frozenset(
    {"StreamingQueryException", "Py4JJavaError", "PythonException", "Py4JError"}
)
# A Java exception whose message only wraps its cause's (Spark's and Hadoop's habit).
_JAVA_WRAPPERS: Final = frozenset(
    {"ExecutionException", "InvocationTargetException", "UndeclaredThrowableException"}
)
_LIMIT: Final = 500
# The libraries whose errors reach a user with their cause inside a wrapper.
_FOREIGN: Final = ("py4j", "pyspark", "deltalake", "confluent_kafka", "pyarrow", "duckdb")


class CtrError(Exception):
    """Base of every error ctr-lambda raises on purpose: its message names the cause and what
    to do, so the CLI prints it as it is and the API maps it to a status in one place."""


class BadArgumentError(CtrError, ValueError):
    """Input that cannot be, naming what is wrong: ``parameter`` (an argument, an option, a
    query parameter) and ``message``; the layers' own kinds derive from it and their base."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = message


class SetupError(CtrError):
    """What this process needs from its machine or its cluster is missing or refuses it: a
    broker that does not answer, a login refused, settings that do not fit, jars not fetched."""


def foreign_or_ours(exc: BaseException) -> bool:
    """``exc`` is one of ours or a library's report of a failure outside this process (a job,
    a store, a broker), not a defect: a user gets :func:`reason_of`, not a traceback."""
    return isinstance(exc, CtrError) or _from_a_library(exc)


def _from_a_library(exc: BaseException) -> bool:
    delta = sys.modules.get("deltalake.exceptions")
    if delta is not None and isinstance(exc, delta.DeltaError):
        return True  # its module is the extension's ``_internal``
    return any((cls.__module__ or "").split(".")[0] in _FOREIGN for cls in type(exc).__mro__)


def reason_of(exc: BaseException) -> str:
    """The one line naming why ``exc`` happened, with the kind of error in parentheses: the
    innermost Python error raised in a task or a foreachBatch function if there is one, else
    the Java exception Spark raised (the deepest ``Caused by``), else a Kafka error's own
    description, else the error's first line."""
    kafka = _kafka_reason(exc)
    if kafka is not None:
        return kafka
    text = _text_of(exc)
    reason = reason_in(text)
    if not reason:
        return type(exc).__name__
    if _from_a_library(exc) and reason == _short(text.strip().splitlines()[0].strip()):
        return f"{reason} ({type(exc).__name__})"  # a library's own message: say whose
    return reason


def reason_in(text: str) -> str:
    """:func:`reason_of` for an error's text (a failed query's exception, a job's stderr)."""
    python = [m for m in _PYTHON_ERROR.finditer(text) if m.group(1) not in _WRAPPERS]
    if python:
        kind, message = python[-1].group(1), python[-1].group(2).strip()
        return _short(f"{message} ({kind})")
    java = [
        m
        for m in _JAVA_ERROR.finditer(text)
        if m.group(2) not in _JAVA_WRAPPERS and m.group(2) not in _WRAPPERS
    ]
    caused_by = [m for m in java if m.group(0).startswith("Caused by: ") and m.group(3)]
    if caused_by or java:
        match = (caused_by or java)[-1] if caused_by else java[0]
        message = (match.group(3) or "").strip()
        return _short(f"{message} ({match.group(2)})" if message else match.group(2))
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return _short(first)


def _text_of(exc: BaseException) -> str:
    """The whole text of ``exc``: a Py4J error's Java exception with its causes (str() of a
    Py4JJavaError names only the call), else str()."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            lines: list[str] = []
            cause = java
            while cause is not None and len(lines) < 20:
                prefix = "Caused by: " if lines else ""
                lines.append(prefix + str(cause.toString()))
                cause = cause.getCause()
            return "\n".join(lines)
        except Exception:  # the JVM is gone: the wrapper's text is all there is
            pass
    return str(exc)


def _kafka_reason(exc: BaseException) -> str | None:
    """A confluent-kafka error's own description (``KafkaException(KafkaError{...})`` prints
    as the tuple of its arguments)."""
    args = getattr(exc, "args", ())
    error = args[0] if args else None
    describe = getattr(error, "str", None)
    name = getattr(error, "name", None)
    if type(error).__name__ != "KafkaError" or not callable(describe) or not callable(name):
        return None
    return _short(f"{describe()} (Kafka {name()})")


def _short(line: str) -> str:
    return line if len(line) <= _LIMIT else line[: _LIMIT - 1] + "…"
