"""The exit-code rule's workers (docs/elastic.md, "Exit codes"), shared by the
tests of every way to start a job: two ranks that end in a known order, one
of which exits non-zero after its function returned."""
import atexit
import os
import time


def end_in_order(pids, failing, elastic=False):
    """Rank 0 returns first; rank 1 returns once rank 0's process has gone.
    Rank `failing` then exits 3 from an exit handler, after its result.

    Args:
        pids: a directory both ranks see, for their pids.
        failing: the rank that exits 3.
        elastic: join the elastic driver's round first (what ``init()`` does).

    Returns:
        This process's rank.
    """
    if elastic:
        from tfring.common import elastic as membership
        membership.join_round()
    rank = int(os.environ.get("TFRING_RANK") or os.environ["PMI_RANK"])
    mine = os.path.join(pids, f"pid.{rank}")
    with open(mine + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(mine + ".tmp", mine)
    first = os.path.join(pids, "pid.0")
    deadline = time.monotonic() + 60
    while rank == 1 and time.monotonic() < deadline:
        try:
            with open(first) as f:
                os.kill(int(f.read()), 0)
        except ProcessLookupError:
            break
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    if rank == failing:
        # Registered last, so it runs first: it also skips tfring's own
        # exit handlers, leaving only the word that the function returned.
        atexit.register(os._exit, 3)
    return rank
