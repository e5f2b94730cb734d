"""Reading py-spy 0.4.3's chrometrace output (`py-spy record --format chrometrace`) back into one sample stream per
process and thread.

The bug it works around: py-spy writes a thread's begin (B) and end (E) events as the difference between a sample
and the previous sample *of the same thread id* (src/chrometrace.rs keeps `prev_traces` keyed by `thread_id`
alone), and a thread id is a pthread_t, which forked processes share: every rank of launcher=prefork has its main
thread's id, and so has the process that forked it. Read per process, the events of such processes are garbage
(ends of frames never begun); and a sample identical to the previous one of the same id, whoever's, writes no event.

What it does: it replays the events per thread id exactly as py-spy wrote them, which gives every written sample's
whole stack; a sample py-spy took but wrote nothing for (a process of a shared id whose stack equalled the id's
previous one at its turn) is put back at each sampling round from that rule: its stack is the id's state at its turn.
py-spy samples every process once a round, in the order of its map of processes (stable while none is added), and
writes them in that order with one clock; the order between two processes is learnt from the rounds that wrote
both. Processes whose thread ids are their own read exactly as written (a run without prefork, with address-space
layout randomization, has no shared ids).

When it can go: once py-spy keys `prev_traces` by process and thread (src/chrometrace.rs, `increment`), each
(pid, tid)'s events replay on their own; tests/test_attribution.py's prefork cases then pass without it.
"""

from __future__ import annotations

from collections import defaultdict

VERSION = "0.4.3"
ROUND_GAP_SECONDS = 0.004  # samples of one round are written within microseconds; rounds are 10 ms apart at 100 Hz


def samples(events: list[dict], intern) -> list[tuple[int, int, float, tuple[int, ...]]]:
    """(pid, tid, seconds, stack) of every sample py-spy took, written or put back, in time order; `intern(event)`
    gives a begin event's frame id. A sample's stack is its frames' ids, outermost first (empty: the end of a
    thread's trace)."""
    written = _written(events, intern)
    by_tid: dict[int, list] = defaultdict(list)
    for sample in written:
        by_tid[sample[1]].append(sample)
    out = []
    for these in by_tid.values():
        pids = {s[0] for s in these}
        out += these if len(pids) == 1 else _with_unwritten(these)
    out.sort(key=lambda s: s[2])
    return out


def _written(events, intern):
    """Replay per thread id: each run of events with one (pid, tid, ts) is one written sample."""
    state: dict[int, list[int]] = defaultdict(list)
    out = []
    key = None
    for e in events:
        k = (e["pid"], e["tid"], e["ts"])
        if k != key and key is not None:
            out.append((key[0], key[1], key[2] / 1e6, tuple(state[key[1]])))
        key = k
        stack = state[e["tid"]]
        if e["ph"] == "B":
            stack.append(intern(e))
        elif e["ph"] == "E" and stack:
            stack.pop()
    if key is not None:
        out.append((key[0], key[1], key[2] / 1e6, tuple(state[key[1]])))
    return out


def _rounds(these):
    rounds, current = [], []
    for s in these:
        if current and s[2] - current[0][2] > ROUND_GAP_SECONDS:
            rounds.append(current)
            current = []
        current.append(s)
    if current:
        rounds.append(current)
    return rounds


def _with_unwritten(these):
    """The samples of processes sharing one thread id, each round completed with those py-spy took but did not
    write."""
    rounds = _rounds(these)
    first = {}
    last = {}
    for s in these:
        first.setdefault(s[0], s[2])
        last[s[0]] = s[2]
    before: dict[tuple[int, int], int] = defaultdict(int)  # (a, b): rounds that wrote a before b
    for r in rounds:
        order = [s[0] for s in r]
        for i, a in enumerate(order):
            for b in order[i + 1:]:
                before[(a, b)] += 1
    out = []
    state: tuple[int, ...] = ()
    for r in rounds:
        t = r[0][2]
        shown = [s[0] for s in r]
        alive = [p for p in first if first[p] <= t <= last[p] and p not in shown]
        states = [state]  # the id's state before each written sample of the round, then after the last
        for s in r:
            states.append(s[3])
        for pid in alive:
            # its turn: after every written sample of the round that came before it in the rounds that wrote both
            after = sum(1 for q in shown if before[(q, pid)] >= before[(pid, q)] and before[(q, pid)] > 0)
            out.append((pid, r[0][1], t, states[after]))
        out += r
        state = r[-1][3]
    return out
