"""What the lens checkers (fw_check.py, lens_check.py) share: PASS/FAIL lines, a count of the
failures for the exit status, and the JSON lines of a run's output file."""
import json

fails = 0


def check(ok, text):
    global fails
    print(("PASS " if ok else "FAIL ") + text)
    fails += 0 if ok else 1


def lines(path):
    """The JSON objects of `path`, one per line starting with "{" ([] if unreadable)."""
    try:
        return [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    except (OSError, ValueError):
        return []
