"""A job's place among other jobs, in its details: the jobs it runs after (its parents), the jobs that run after
it (its children), what it still waits for, and the workflows and groups it belongs to, each a link that goes
there. What it shows is the dashboard's read of the job (store/lineage.py)."""

from html import escape

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QGridLayout, QLabel, QWidget

from queueprocessor.rules.states import JobState

from . import theme

SHOWN = 20  # linked jobs listed per line; the rest are counted (a group's callback runs after all its members)


def waits_text(ids: list[int]) -> str:
    """What a waiting job waits for, the same in the jobs table's tooltip, its details and the graph."""
    return "waits for " + ", ".join(str(i) for i in ids) if ids else "waits to be released"


def _job_link(job: dict) -> str:
    scheme = theme.current()
    colour = theme.readable(theme.JOB_STATE.get(job["state"], scheme.muted), scheme.base)
    step = f" {escape(job['step'])}" if job.get("step") else ""
    return f'<a href="job:{job["id"]}">{job["id"]}{step}</a> <span style="color:{colour}">●&nbsp;{job["state"]}</span>'


def _jobs_line(jobs: list[dict], more_in: list[dict]) -> str:
    shown = ", ".join(_job_link(job) for job in jobs[:SHOWN])
    if len(jobs) > SHOWN:
        where = f" (see {more_in[0]['kind']} {more_in[0]['id']})" if more_in else ""
        shown += f", and {len(jobs) - SHOWN:,} more{where}"
    return shown or "–"


def _flow_link(flow: dict) -> str:
    name = f" {escape(flow['name'])}" if flow["name"] else ""
    role = (
        f" · {'its callback' if flow['step'] == 'callback' else 'step ' + escape(flow['step'])}" if flow["step"] else ""
    )
    return f'<a href="flow:{flow["id"]}">{flow["kind"]} {flow["id"]}{name}</a>{role}'


class JobLinks(QWidget):
    """Parents, children, waits and flows of the job the details show; a click on one goes there."""

    job_clicked = Signal(int)  # a job id: show that job
    flow_clicked = Signal(int)  # a workflow's or group's id: open its graph

    def __init__(self, parent=None):
        super().__init__(parent)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(3)
        self.fields: dict[str, QLabel] = {}
        self.titles: dict[str, QLabel] = {}  # hidden with their value when there is nothing to say
        lines = (("after", "Runs after"), ("children", "Runs before"), ("waits", "Waits for"), ("flows", "Part of"))
        for row, (key, label) in enumerate(lines):
            value = QLabel("")
            value.setTextFormat(Qt.TextFormat.RichText)
            value.setWordWrap(True)
            value.linkActivated.connect(self._clicked)
            title = QLabel(label, objectName="muted")
            grid.addWidget(title, row, 0)
            grid.addWidget(value, row, 1)
            self.fields[key], self.titles[key] = value, title
        grid.setColumnStretch(1, 1)
        self.show_job(None)

    def show_job(self, job: dict | None) -> None:
        job = job or {}
        after, children, flows = job.get("after", []), job.get("children", []), job.get("flows", [])
        self._say("after", _jobs_line(after, flows) if after else "")
        self._say("children", _jobs_line(children, []) if children else "")
        holding = set(job.get("waits_for", []))
        waiting = job.get("state") == JobState.WAITING
        self._say("waits", _jobs_line([p for p in after if p["id"] in holding], flows) if waiting else "")
        self._say("flows", ", ".join(_flow_link(flow) for flow in flows))

    def _say(self, key: str, html: str) -> None:
        field = self.fields[key]
        field.setText(html)
        field.setVisible(bool(html))
        self.titles[key].setVisible(bool(html))

    def _clicked(self, link: str) -> None:
        kind, _, ref = link.partition(":")
        (self.job_clicked if kind == "job" else self.flow_clicked).emit(int(ref))

    def links(self, key: str) -> list[str]:
        """The targets a line links to ("job:12", "flow:3"), in order: what a test clicks."""
        text = self.fields[key].text()
        return [part.split('"', 1)[0] for part in text.split('href="')[1:]]
