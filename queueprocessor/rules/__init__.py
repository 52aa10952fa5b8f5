"""The pure rules: what a job, a queue, a schedule, a machine's state and a turn are, and how each is worded.

Nothing here opens a connection, starts a thread or imports SQLAlchemy: each module is functions and plain data,
tested alone. A module here imports only the standard library, click and croniter, and other modules of rules/.
"""
