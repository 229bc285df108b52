"""Which MiniWoB pages the `miniwob` env's experts solve, and with which actions (issue 51).

Each page runs for a few seeds through `rlany rollout --expert` (real Chromium, no model,
screens off); the table gives, per page, the episodes solved, the steps, and the verbs of
the actions the expert took. The pages marked * need what came with BrowserGym's action set
(select_option, press, fill of a date/time input, or the accordion's `tab` rows): before it,
the env could not act on them at all.

    python research/miniwob_pages.py                      # every page with an expert, seeds 0 1
    python research/miniwob_pages.py --pages choose-list,terminal --seeds 0 1 2 --save

--save writes research/results/miniwob-pages.json (with the machine). Cost: ~0.1-0.5 s an
episode after the browser's start (~2 s), 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lab import save  # noqa: E402

from rlany.api import Lineage, Task, to_json  # noqa: E402

BEFORE = ("click-test,click-test-2,click-button,click-button-sequence,click-link,click-tab,"
          "focus-text,focus-text-2,enter-text,enter-text-2,enter-password,login-user,"
          "click-dialog,click-option,click-checkboxes").split(",")
NEW = ["choose-list", "enter-date", "enter-time", "click-collapsible", "terminal"]


def verb(action: str | None) -> str:
    return (action or "none").split(" ")[0].split("(")[0]


def run(pages: list[str], seeds: list[int]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tasks, out = Path(tmp) / "tasks.jsonl", Path(tmp) / "traj.jsonl"
        with tasks.open("w") as f:
            for page in pages:
                for seed in seeds:
                    tid = f"{page}-s{seed}"
                    task = Task(task_id=tid, env="miniwob", prompt="", lineage=Lineage(tid),
                                spec={"task": page, "seed": seed, "screens": "none"})
                    f.write(json.dumps(to_json(task)) + "\n")
        started = time.time()
        subprocess.run([sys.executable, "-m", "rlany", "rollout", "-i", str(tasks), "-o",
                        str(out), "--expert", "--n", "1", "--max-steps", "10"], check=True)
        seconds = time.time() - started
        trajs = [json.loads(x) for x in out.read_text().splitlines() if '"steps"' in x]
    rows = {}
    for page in pages:
        mine = [t for t in trajs if t["task_id"].rsplit("-s", 1)[0] == page]
        verbs = Counter(verb(s.get("action")) for t in mine for s in t["steps"])
        errored = sum(t.get("finish") == "error" for t in mine)  # the browser's, not its
        rows[page] = {"solved": sum(t["outcome"] == 1 for t in mine),
                      "tried": len(mine) - errored, "errored": errored,
                      "steps": sum(len(t["steps"]) for t in mine), "verbs": dict(verbs),
                      "new": page in NEW}
    return {"seeds": seeds, "seconds": round(seconds, 1), "pages": rows}


def table(result: dict) -> str:
    lines = ["| page | solved | steps | actions |", "|---|---|---|---|"]
    for page, r in result["pages"].items():
        acts = ", ".join(f"{v} x{k}" for v, k in sorted(r["verbs"].items()))
        lines.append(f"| {page}{' *' if r['new'] else ''} | {r['solved']}/{r['tried']} "
                     f"| {r['steps']} | {acts} |")
    solved = sum(r["solved"] == r["tried"] > 0 for r in result["pages"].values())
    lines.append(f"\n{solved} of {len(result['pages'])} pages solved on every seed "
                 f"({result['seconds']} s for all, browser start included).")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", default=",".join(BEFORE + NEW), help="comma list of pages")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--save", action="store_true", help="write results/miniwob-pages.json")
    args = ap.parse_args()
    result = run([p for p in args.pages.split(",") if p], args.seeds)
    print(table(result))
    if args.save:
        print(f"wrote {save('miniwob-pages', result)}", file=sys.stderr)


if __name__ == "__main__":
    main()
