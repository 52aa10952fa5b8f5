"""bench/simulate.py runs the node's own roster, clock and turn code for many virtual machines: a short run of it
must keep the turn discipline."""

from bench.simulate import options, simulate


def test_fifty_simulated_machines_never_poll_a_slot_twice_through_joins_deaths_pauses_and_freezes():
    result = simulate(options(["--machines", "50", "--slots", "200", "--churn", "3", "--tail", "0.05"]))
    assert {kind: result["life"][kind] for kind in ("deaths", "pauses", "freezes")} == dict(
        deaths=3, pauses=3, freezes=3
    )
    assert result["double"] == 0
    assert result["missed"] <= 0.05 * result["slots"], result
    assert result["bound_ratio"] <= 1.0, "each machine's clock error stayed within its own bound"


def test_a_moved_roster_version_costs_the_rows_changed_not_every_row():
    """Each simulated node reads the rows changed since its version (store/roster.py): a run's roster reads return
    a small share of what reading every row at each moved version (main's read) would have."""
    result = simulate(options(["--machines", "50", "--slots", "200", "--churn", "3"]))
    assert result["double"] == 0
    assert 0 < result["roster_rows"] < result["roster_rows_main"] / 10, result


def test_nodes_that_share_a_computed_roster_decide_as_if_each_computed_its_own():
    """The simulator lends a roster the node's code computed for one node to the others whose copies give the same
    (SharedRosters): on a small farm with every kind of change, the figures are those of each node computing its
    own, and most rosters were lent."""
    argv = ["--machines", "30", "--slots", "400", "--churn", "6", "--tail", "0.05", "--seed", "1"]
    shared, alone = simulate(options(argv)), simulate(options([*argv, "--per-node"]))
    assert shared.pop("lent") > 2 * shared.pop("computed"), "the nodes shared their rosters"
    assert (alone.pop("lent"), alone.pop("computed")) == (0, 0)
    assert shared == alone
