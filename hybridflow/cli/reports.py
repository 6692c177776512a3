"""What a run, a watch session and a plan print: the listeners the API reports to, in the terminal."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from ..errors import counted
from . import supervision
from .console import err, out
from .guard import print_error


class RunReport:
    """Progress while a run goes; its summary once its record is final (also when a stuck stage forces
    the run to end, and the process exits right after); what the API reports besides."""

    def __init__(self, progress) -> None:
        self.progress = progress

    def __getattr__(self, name: str):
        return getattr(self.progress, name)  # run_started, engine_started, stage_changed, close

    def resuming(self, run_id: str, status: str) -> None:
        err.print(f"resuming run {run_id} ({status})", markup=False)

    def nothing_to_resume(self, reason: str) -> None:
        out.print(f"nothing to resume: {reason}")

    def notified(self, delivery) -> None:
        if delivery.ok:
            err.print(f"[dim]notified by {delivery.channel}: {escape(delivery.detail)}[/]", soft_wrap=True)
        else:
            err.print(f"[yellow]warning:[/] notification by {delivery.channel} failed: {escape(delivery.detail)}",
                      soft_wrap=True)

    def run_started(self, run_id, stages) -> None:
        supervision.run_began(run_id)
        self.progress.run_started(run_id, stages)

    def run_finished(self, result) -> None:
        from ..reporting.progress import summary_line, summary_table

        supervision.run_ended(result.run_id)
        self.progress.close()
        out.print(summary_table(result))
        out.print(summary_line(result))
        report = _report_line(result)
        if report:
            out.print(report, soft_wrap=True, markup=False)
        for stage in result.failed:
            err.print(f"[bold red]{stage.name} failed:[/] {escape(stage.error or '')}", soft_wrap=True)
            err.print(f"  log: {stage.log_path}", soft_wrap=True, markup=False)
        if result.resume_command:
            err.print(f"resume with: {result.resume_command}", soft_wrap=True, markup=False)
        for warning in result.warnings:
            err.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)


def terminal_run_report() -> RunReport:
    """A run's report with its progress drawn on stderr."""
    from ..reporting.progress import listener_for

    return RunReport(listener_for(err))


def _report_line(result) -> str | None:
    """Where the run wrote its report.html, and the command that opens it; None where it wrote none
    (report: false, or writing it failed)."""
    import shlex

    from ..reporting.htmlreport import REPORT_FILE

    path = Path(result.run_dir) / REPORT_FILE
    if not path.is_file():
        return None
    workdir = result.workdir_uri or Path(result.run_dir).parents[2]  # <workdir>/<pipeline>/runs/<run>
    option = "" if workdir == Path(".hybridflow").resolve() else f" -w {shlex.quote(str(workdir))}"
    return f"report: {path} (hybridflow report{option} --open opens it)"


class WatchReport:
    """A watch session in the terminal: each run's progress and summary as `run` prints them, and
    what the session waits for between runs."""

    def listener(self):
        return terminal_run_report()

    def waiting(self, files) -> None:
        err.print(f"[dim]watching {len(files)} files for changes (Ctrl-C stops)[/]")

    def changed(self, files) -> None:
        names = ", ".join(str(f) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        err.print(f"changed: {escape(names)}", soft_wrap=True)

    def invalid(self, error) -> None:
        print_error(error)

    def notice(self, text: str) -> None:
        err.print(f"[dim]{escape(text)}[/]", soft_wrap=True)


def print_plan(plan) -> None:
    from ..reporting.progress import plan_table

    out.print(plan_table(plan.pipeline, plan.decisions))
    for stage, item in plan.missing:
        out.print(f"[red]missing input[/] {item.dataset} of stage {stage}: {escape(item.detail)}", soft_wrap=True)
    runs = len(plan.to_run)
    out.print(f"{runs} of {counted(len(plan.decisions), 'stage')} to run, {len(plan.decisions) - runs} up to date")
    for engine, cluster in plan.clusters.items():
        out.print(f"would bring up a {engine} cluster ({cluster})", soft_wrap=True, markup=False)
