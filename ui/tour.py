"""Help ▸ Tour: what the demo farm shows in each tab, and what to try. The demo opens it at start (`--tour`)."""

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QVBoxLayout, QWidget

TOUR = """<h3>A tour of the demo farm</h3>
<p>Three machines, this app's node (on the left) among them, take turns polling one database; the strip on top
shows whose turn each slot was. Every queue shows one capability:</p>
<ul>
<li><b>Job runs</b>: long <i>reports</i> report progress (at most 2 at once farm-wide); <i>index</i> jobs run
many to a call of one batch function; select a job of a workflow or group and follow the link in its
details to its graph (<i>publish-album</i> fans out to four resizes and back in; <i>thumbnails</i> ends with a
callback).</li>
<li><b>Queues</b>: <i>mail</i> is rated at 2 starts a second, <i>orders</i> runs each customer's orders in order
(order keys), <i>tenants</i> shares by weight (acme 3 : globex 1 : initech 1), and <i>partner</i>'s target is
down 20 s a minute: watch its breaker open, send canaries and close.</li>
<li><b>Schedules</b>: <i>demo-report</i> every 10 s with jitter runs 12 s: overlap=skip skips the next one.
A debounced save of doc-42 waits while its edits keep coming (15 s at most); the <i>demo-watcher</i> singleton
runs on one machine.</li>
<li><b>Events</b>: machines joining, the breaker, schedules, and what you do.</li>
</ul>
<p><b>Try:</b> pause or drain this machine from the <b>Node</b> menu, or another from its right-click menu in
<b>Peers</b>; kill one from the <b>Node</b> menu (<b>Kill a Machine on This Host ▸ demo-3</b>) and watch its jobs
move to the others once its lease ends. The 12 <i>imports</i> jobs failed while their target was down for
the first minute: in <b>Job runs</b> filter <i>failed</i>, queue <i>imports</i>, and retry them all at once.</p>"""


class TourDialog(QDialog):
    """The tour, beside the window (not modal): the farm stays live while it is read."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("tourDialog")
        self.setWindowTitle("Tour")
        self.setModal(False)
        layout = QVBoxLayout(self)
        text = QLabel(TOUR)
        text.setTextFormat(Qt.TextFormat.RichText)
        text.setWordWrap(True)
        text.setMinimumWidth(560)
        layout.addWidget(text)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        layout.addWidget(buttons)
