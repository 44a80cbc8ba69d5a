"""The HTML audit report (``exhume report RUN``)."""

from exhume.report.html import render, verdict, write_report

__all__ = ["render", "verdict", "write_report"]
