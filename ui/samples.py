"""Counts sampled from each snapshot, for the plots of what the database keeps no history of (jobs by state,
each queue's waiting and running)."""

from collections import deque


def keep(samples: deque, sample: tuple, history: float) -> None:
    """Add `sample` (its database time first) and drop the samples more than `history` seconds older."""
    samples.append(sample)
    while samples[0][0] < sample[0] - history:
        samples.popleft()
