"""The must-hold scripts' checks (bench/*_check.py): each prints ok or FAIL with what
it checked; `failed` lists the failures, for the script's exit status."""

failed = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failed.append(what)
    return cond
