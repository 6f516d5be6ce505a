"""What the h5py checkers share: collect every mismatch, then report them all (check_dump_layout.py,
check_rank_dumps.py)."""

errors = []


def check(cond, msg):
    if not cond:
        errors.append(msg)
    return cond


def report(heading, ok_line):
    """Exit status of a checker: 1 with every mismatch listed (50 at most) under `heading`, else 0 after ok_line."""
    if errors:
        print(f"{len(errors)} {heading}:")
        for e in errors[:50]:
            print("  " + e)
        return 1
    print(ok_line)
    return 0
