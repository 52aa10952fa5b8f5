"""The QueueProcessor desktop app (PySide6 + pyqtgraph): runs this machine's node and shows the whole farm live.

Start it with `queueprocessor gui`, `queueprocessor-gui` or `python -m ui`.
The core (`queueprocessor`) never imports this package.
"""
