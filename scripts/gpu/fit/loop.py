"""What check.py and long.py print alike of a serve.py run: sizes in GiB, and the run's
progress lines (every large request, the end, and every 120th request)."""


def gib(b):
    return "%.2f GiB" % (b / (1 << 30)) if isinstance(b, (int, float)) else str(b)


def print_progress(lines):
    for l in lines:
        if l["kind"] in ("large", "oom", "done") or (l["kind"] == "req" and l["index"] % 120 == 0):
            print("  +%6.1f s %-5s #%-5s reserved %s allocated %s split-free %s device free %s" % (
                l["t"], l["kind"], l.get("index", ""), gib(l.get("reserved")), gib(l.get("allocated")),
                gib(l.get("inactive_split")), gib(l.get("device_free"))))
