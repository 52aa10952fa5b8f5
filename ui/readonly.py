"""Actions the farm would refuse: disabled, each with a tooltip saying why (docs/app.md, "Read-only").

A window may not change its farm when it only watches (--observe) or when its
database user may only read (Farm.why_read_only, asked once on connect). Every
action that changes the farm is then disabled and its tooltip says why, so the
operator learns it before clicking rather than from a failure; once the window
may write again (another database), each gets its own tooltip back.
"""

from collections.abc import Iterable

from PySide6.QtGui import QAction

WATCHING = "this app only watches the farm: start it without --observe to change it"
_OWN_TIP = "ownToolTip"  # an action's own tooltip, kept while a refusal shows in its place


def refuse(actions: Iterable[QAction], why: str | None) -> None:
    """Disable `actions` and say `why` in their tooltips; with `why` None, give them their own tooltips back
    (whoever enables an action decides when it is enabled)."""
    for action in actions:
        own = action.property(_OWN_TIP)
        if own is None:
            own = action.toolTip()
            action.setProperty(_OWN_TIP, own)
        if why:
            action.setEnabled(False)
            action.setToolTip(f"Read-only: {why}")
        else:
            action.setToolTip(own)
