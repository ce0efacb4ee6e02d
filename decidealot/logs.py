"""Process-wide logging: one line per record, JSON or text (docs/operations.md#logs), each with
the request id the HTTP layer sets in a context variable (and, inside a span, the trace's ids).
Lines never carry state contents or keys: callers log names and sizes.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
import traceback

import msgspec

from decidealot import tracing

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        span = tracing.current()
        record.trace_id = format(span.trace_id, "032x") if span is not None else ""
        record.span_id = format(span.span_id, "016x") if span is not None else ""
        record.trace = f" trace_id={record.trace_id} span_id={record.span_id}" if span else ""
        return True


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        if getattr(record, "trace_id", ""):
            line["trace_id"] = record.trace_id
            line["span_id"] = record.span_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return msgspec.json.encode(line).decode()


_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s%(trace)s] %(message)s"


def configure(level: str = "info", fmt: str = "auto") -> None:
    """Install the one stderr handler; granian's own loggers go through it too. `fmt` is
    `json`, `text`, or `auto`: text when stderr is a terminal, JSON otherwise."""
    if fmt == "auto":
        fmt = "text" if sys.stderr.isatty() else "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter())
    handler.setFormatter(_JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("_granian", "granian.access", "granian"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


def log_failure(logger: logging.Logger, exc: BaseException, what: str) -> None:
    """Log an unexpected exception by type and frames only: its message may quote request
    contents (state, criteria) or upstream bodies."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    logger.error("%s: unexpected %s\n%s", what, type(exc).__name__, frames.rstrip())
