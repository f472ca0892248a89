"""Checks of scripts/gpu/holders/run.sh's files: PASS/FAIL per line, then the figures."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checking import Checks, norm  # noqa: E402

C = Checks(sys.argv[1])
load, lines, check = C.load, C.lines, C.check


for case in ("lens", "nolens"):
    holder, asker = load(case + ".holder.json"), load(case + ".asker.json")
    state, cap, log = load(case + ".state.json"), load(case + ".capture.json"), load(case + ".log.json")
    hpid, apid = holder.get("pid"), asker.get("pid")
    idle = holder.get("reserved", 0) - holder.get("allocated", 0)
    print("%s: holder %s reserved %s allocated %s; asker %s fitted %s" % (
        case, hpid, holder.get("reserved"), holder.get("allocated"), apid, asker.get("fitted")))
    live = [i for i in state.get("snapshot", {}).get("incidents", []) if i.get("pid") == apid]
    check(len(live) >= 1, "%s: the agent has the asker's incident" % case)
    inc = live[0] if live else {}
    holders = inc.get("holders", [])
    top = holders[0] if holders else {}
    print("  live verdict %s; holders %s" % (inc.get("verdict"), json.dumps(holders)))
    check(norm(inc.get("verdict")) == "otherprocess", "%s: live verdict other_process" % case)
    check(top.get("pid") == hpid, "%s: the holder %s named first" % (case, hpid))
    if case == "lens":
        check(top.get("releasable_bytes") == idle,
              "lens: releasable %s = memory_reserved() - memory_allocated() %s" % (top.get("releasable_bytes"), idle))
    else:
        check(norm(top.get("sight")) == "cachenotvisible" and top.get("not_visible_bytes", 0) > 0,
              "nolens: the holder named as a framework cache not visible (%s)" % top.get("sight"))
    ooms = [o for o in cap.get("ooms", []) if o.get("pid") == apid]
    check(bool(ooms) and norm(ooms[0].get("verdict")) == "otherprocess",
          "%s: analyze of the agent's capture agrees (%s)" % (case, ooms[0].get("verdict") if ooms else None))
    li = log.get("log_incidents", [])
    verdict = (li[0].get("verdict_name") or li[0].get("verdict")) if li else None
    check(norm(verdict) == "otherprocess", "%s: analyze of the asker's crash log agrees (%s)" % (case, verdict))

holder, asker, cap = load("run.holder.json"), load("run.asker.json"), load("run.capture.json")
ooms = [o for o in cap.get("ooms", []) if o.get("pid") == asker.get("pid")]
top = ooms[0]["holders"][0] if ooms and ooms[0].get("holders") else {}
print("run: holder %s untraced; asker %s; verdict %s; holders %s" % (
    holder.get("pid"), asker.get("pid"), ooms[0].get("verdict") if ooms else None, json.dumps(ooms[0].get("holders") if ooms else None)))
check(bool(ooms) and norm(ooms[0].get("verdict")) == "otherprocess", "run: other_process with the holder untraced")
check(top.get("pid") == holder.get("pid") and norm(top.get("sight")) == "untraced",
      "run: the untraced holder named from NVML (%s, %s)" % (top.get("pid"), top.get("sight")))
print("driver reserve: %s" % json.dumps(load("reserve.json")))
print("%d failed" % C.fails)
