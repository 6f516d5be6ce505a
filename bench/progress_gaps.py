#!/usr/bin/env python3
"""Silences on stderr: run a command, timestamp every stderr line as it arrives, and print the largest gaps.

    bench/progress_gaps.py [--max S] [--top N] [--stdout FILE] [--quiet] -- COMMAND ARGS...

A gap is the time between one stderr line and the next (the command's start counts as the first event, its exit as
the last), so a phase that prints nothing for a while shows as the gap after the line before it. Prints the command's
wall time, the N largest gaps with the lines on both sides, and the whole stderr with each line's time (--quiet: not
that). --max S: exit 1 when a gap is longer than S seconds (else the command's own exit code is ignored: 0).
The command's stdout goes to FILE (default: discarded). Python 3 standard library only.
"""
import argparse
import subprocess
import sys
import time


def measure(cmd, stdout=None):
    """Runs cmd; returns (events, exit code): events are (seconds since start, stderr line) with the start and exit."""
    out = open(stdout, "wb") if stdout else subprocess.DEVNULL
    try:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE)
        events = [(0.0, "(start)")]
        for raw in p.stderr:  # one line as it arrives (the pipe is read unbuffered line by line)
            events.append((time.monotonic() - t0, raw.decode("utf-8", "replace").rstrip("\n")))
        rc = p.wait()
        events.append((time.monotonic() - t0, "(exit %d)" % rc))
        return events, rc
    finally:
        if stdout:
            out.close()


def gaps(events):
    """(gap seconds, line before, line after), largest first."""
    g = [(b[0] - a[0], a, b) for a, b in zip(events, events[1:])]
    return sorted(g, key=lambda x: -x[0])


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=float, default=None, help="exit 1 when a gap exceeds this many seconds")
    ap.add_argument("--top", type=int, default=3, help="how many of the largest gaps to print")
    ap.add_argument("--stdout", default=None, help="write the command's stdout here")
    ap.add_argument("--quiet", action="store_true", help="print only the wall time and the largest gaps")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        ap.error("no command given (put it after --)")
    events, rc = measure(cmd, a.stdout)
    if not a.quiet:
        for t, line in events:
            print("%8.2f  %s" % (t, line))
    g = gaps(events)
    print("wall %.1f s, exit %d, %d stderr lines" % (events[-1][0], rc, len(events) - 2))
    for s, (ta, la), (tb, lb) in g[: a.top]:
        print("gap %.1f s: after [%.1f] %s\n            until [%.1f] %s" % (s, ta, la[:150], tb, lb[:150]))
    if a.max is not None and g and g[0][0] > a.max:
        print("largest gap %.1f s > %.1f s" % (g[0][0], a.max))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
