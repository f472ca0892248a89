"""Helpers the GPU check scripts share (scripts/gpu/holders/check.py, scripts/gpu/raise/check.py):
a run's files read as JSON, PASS/FAIL lines counted, names compared without case or underscores."""
import json
import os


class Checks:
    def __init__(self, out):
        self.out = out
        self.fails = 0

    def load(self, name):
        """A file's JSON: the whole text, else its last line (programs that print more)."""
        try:
            with open(os.path.join(self.out, name)) as f:
                text = f.read().strip()
        except OSError as e:
            return {"_error": repr(e)}
        for candidate in (text, text.splitlines()[-1] if text else ""):
            try:
                return json.loads(candidate)
            except ValueError:
                pass
        return {"_error": name + ": not JSON"}

    def lines(self, name):
        """The JSON lines of a file (those that start with '{')."""
        try:
            with open(os.path.join(self.out, name)) as f:
                return [json.loads(l) for l in f if l.startswith("{")]
        except OSError:
            return []

    def check(self, ok, what):
        self.fails += not ok
        print("%s %s" % ("PASS" if ok else "FAIL", what))


def norm(v):
    """A verdict or outcome name, compared without case or underscores."""
    return str(v).lower().replace("_", "")
