"""HTML reports built from saved run outputs (never from the live engine)."""

from servesim.report.run_report import write_run_report

__all__ = ["write_run_report"]
