"""Claim: `plexus schedule` prints a pipeline schedule as a table a person can
read (one column per pipeline rank, one row per time slot, every forward and
backward of every stage and micro-batch in its rank's column, OPT last) and
the simulated bubble of every rank, equal to the formula it prints; and bad
input ends it with a non-zero exit and one clear message, never a table:
interleaved with micro-batches not a multiple of the pipeline ranks (both
numbers named), --virtual with 1f1b, an unknown schedule, a missing --pp.
`plexus --help` lists the command."""

import re

import cli_util as cu


def table_cells(out, p):
    """{rank: [cell text, ...]} from the table's rows."""
    cells = {r: [] for r in range(p)}
    for line in out.splitlines():
        if not re.match(r"^( *\d+|step) +\|", line):
            continue
        parts = [c.strip() for c in line.split("|")[1:]]
        cu.check(len(parts) == p, "row with %d columns, expected %d: %r" % (len(parts), p, line))
        for r, c in enumerate(parts[:p]):
            cells[r].append(c)
    return cells


def run_ok(args):
    p = cu.run(["schedule"] + args, timeout=60)
    cu.check(p.returncode == 0, "plexus schedule %s: exit %d\n%s" % (" ".join(args), p.returncode, p.stderr))
    return p.stdout


def check_schedule(kind, p, m, v=1):
    args = ["--pp", str(p), "--micro-batches", str(m), "--schedule-pp", kind]
    if v > 1:
        args += ["--virtual", str(v)]
    out = run_ok(args)
    label = "%s p %d m %d v %d" % (kind, p, m, v)
    cu.check(("schedule %s:" % kind) in out, "%s: no title\n%s" % (label, out))
    header = [l for l in out.splitlines() if l.startswith("slot")]
    cu.check(header and all(("rank %d" % r) in header[0] for r in range(p)),
             "%s: header lacks the rank columns: %r" % (label, header))
    cells = table_cells(out, p)
    S = p * v
    for r in range(p):
        words = " ".join(cells[r]).split()
        for s in range(r, S, p):
            for i in range(m):
                for op in ("F", "B"):
                    n = words.count("%s%d.%d" % (op, s, i))
                    cu.check(n == 1, "%s: rank %d's column has %s%d.%d %d times" % (label, r, op, s, i, n))
        cu.check(cells[r] and cells[r][-1] == "OPT", "%s: rank %d does not end with OPT" % (label, r))
        # A forward's activation arrives before it (an earlier row or earlier in its cell).
        if p > 1:
            for s in [x for x in range(r, S, p) if x > 0]:
                for i in range(m):
                    cu.check(words.index("rA%d.%d" % (s, i)) < words.index("F%d.%d" % (s, i)),
                             "%s: rank %d receives stage %d micro %d's activation after its forward" % (label, r, s, i))
    # Rows: makespan 2 (v m + p - 1) slots with tf = tb = 1, plus the step row.
    rows = len(cells[0])
    cu.check(rows == 2 * (v * m + p - 1) + 1, "%s: %d rows, expected %d" % (label, rows, 2 * (v * m + p - 1) + 1))
    formula = re.search(r"formula \S+ = ([0-9.]+)", out)
    want = (p - 1) / ((v if kind == "interleaved" else 1) * m + p - 1)
    cu.check(formula and abs(float(formula.group(1)) - want) < 1e-4,
             "%s: formula line %r, expected %.4f" % (label, formula and formula.group(0), want))
    bubbles = [float(x) for x in re.findall(r"rank \d+: bubble ([0-9.]+)", out)]
    cu.check(len(bubbles) == p and all(abs(b - want) < 1e-4 for b in bubbles),
             "%s: bubbles %s, expected %d of %.4f" % (label, bubbles, p, want))


def expect_fail(args, *needles):
    p = cu.run(["schedule"] + args, expect_ok=False, timeout=60)
    text = p.stdout + p.stderr
    label = " ".join(args)
    cu.check(0 < p.returncode < 128, "%s: exit %d, expected a clean non-zero exit" % (label, p.returncode))
    cu.check("slot " not in p.stdout, "%s: printed a table for bad input" % label)
    for n in needles:
        cu.check(n in text, "%s: message lacks %r:\n%s" % (label, n, text))


def main():
    check_schedule("1f1b", 4, 8)
    check_schedule("gpipe", 2, 4)
    check_schedule("1f1b", 4, 2)          # fewer micro-batches than stages
    check_schedule("gpipe", 3, 1)         # one micro-batch
    check_schedule("interleaved", 2, 4, 2)
    check_schedule("interleaved", 4, 4, 2)  # v > 1 with m = p

    expect_fail(["--pp", "4", "--micro-batches", "6", "--schedule-pp", "interleaved", "--virtual", "2"],
                "6 micro-batches", "4 pipeline ranks", "multiple")
    expect_fail(["--pp", "2", "--micro-batches", "4", "--schedule-pp", "1f1b", "--virtual", "2"],
                "virtual", "interleaved")
    expect_fail(["--pp", "2", "--micro-batches", "4", "--schedule-pp", "zb"], "\"zb\"", "gpipe, 1f1b or interleaved")
    expect_fail(["--micro-batches", "4"], "--pp")
    expect_fail(["--pp", "0", "--micro-batches", "4"], "--pp", "positive integer")

    p = cu.run(["--help"], timeout=30)
    cu.check("schedule" in p.stdout, "plexus --help does not list schedule")
    p = cu.run(["schedule", "--help"], timeout=30)
    cu.check(p.returncode == 0 and "--schedule-pp" in p.stdout and "--virtual" in p.stdout,
             "plexus schedule --help:\n%s" % p.stdout)
    cu.finish("test_pp_schedule_cli_prints_table_and_refuses_bad_input")


if __name__ == "__main__":
    main()
