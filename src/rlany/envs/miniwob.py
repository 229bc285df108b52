"""`miniwob`: MiniWoB++ web tasks in a real headless Chromium (the paper's GUI setting, small).

spec:
    {"task": a MiniWoB page ("click-button"; any of the `miniwob` package's pages runs, those
             in `miniwob_expert.PLANS` also have an expert, step labels and edits),
     "seed": int (MiniWoB draws the page from it: same seed, same page),
     "max_steps": int (default: the expert's most steps + 2),
     "screens": "record" (default) | "observe" | "none",
     "hint": str (optional; shown under the instruction, a rewriter may add or change it)}

`make_tasks` knobs (`rlany envs make-tasks miniwob --knob KEY=VALUE`):
    tasks    comma list of pages with an expert (default click-button,click-link,click-tab,
             focus-text,enter-text); each task draws one of them and a page seed
    slack    steps allowed beyond the expert's most (default 2): max_steps = most + slack
    screens  record (default) | observe | none, as spec.screens
    prefix   the task ids' prefix (default web: web-SEED-0000, web-SEED-0001, ...)

Each turn the agent reads the instruction, the page as an accessibility-tree style list
(`miniwob_page`: each element's ref, role, name, value, options, and whether it has the
focus, is checked, expanded, disabled or not visible) and the numbered admissible actions.
Actions are BrowserGym's high-level set (`miniwob_actions`): click, fill, select_option,
press, hover, scroll and mouse_click, answered as a listed line (its number or its text:
`type "KENETH" into [5]`) or as BrowserGym's call (`fill('5', 'KENETH')`); the text typed
is exactly the text answered. A listed line answered with a slip maps to the nearest one
(`rlany.envs.parse_action`). The action runs as it was read (not re-read from its listed
line). An action the page cannot do (no such element, not a text field, no such option, an
unknown key, numbers that are not finite or a click off the window), or one the reading
trips over (`rlany.envs.read_action`: text with a lone surrogate, a ref of 10,000 digits), is
answered "Error: ..." in one line before the next observation; an answer that names no action is
answered "Nothing happens.". The episode ends when MiniWoB
ends it (success: MiniWoB's raw reward > 0) or at max_steps. MiniWoB's 10-second episode
timer is lifted (a policy model may take longer to answer) and its reward is not
time-scaled.

Screens (PNG of the 160x210 task area, named by content under ~/.cache/rlany/screens/,
$RLANY_CACHE/screens if set): "record" takes one after reset and after each step and puts
[[before], [after]] in the step's info["screens"] (each a list of image paths, the shape
openenv uses) while the policy reads text only (text-only models, `hf`); "observe" also
gives them to the policy and the judge as the observation's images (a vision model, vllm or
openai engine); "none" takes none (faster).

Expert and labels (tasks in PLANS): `expert_action()` is the next action of a shortest plan,
read from MiniWoB's own fields (the instruction's target) and the page
(`miniwob_expert`); info["label"] is +1 when a step's action was such an action, else -1.
`edits` moves a task one rung along `miniwob_expert.LADDERS` (click-test -> click-test-2 ->
click-button -> click-button-sequence; enter-text -> enter-password -> login-user; ...),
same seed, or moves max_steps by one.

The browser (`browser`): one headless Chromium per process, a tab per live episode, tabs
reused by later episodes, none left behind when the process dies; a reset that fails gives
its tab back. If the browser fails (a WebDriver error, or its connection lost), it is
restarted and the episode replayed from its seed and actions (a page is a function of its
seed), once per call; each such retry is counted in the step's info["browser_retries"] and
said on stderr. A second failure ends the episode as an error; any other exception is a bug
and is raised as it is, with no restart.
"""

from __future__ import annotations

import random
import re
import time
import weakref
from pathlib import Path

from rlany.envs import Edit, Observation, StepResult, parse_action, read_action, save_screen
from rlany.envs import miniwob_actions as acts
from rlany.envs import miniwob_page as page
from rlany.envs.browser import browser
from rlany.envs.miniwob_expert import LADDERS, PLANS, expert
from rlany.errors import RlanyError
from rlany.files.records import Lineage, Task

PROMPT = ("You are operating a web page. Each turn, answer with exactly one admissible action, "
          "either its number or its text.")
DEFAULT_TASKS = "click-button,click-link,click-tab,focus-text,enter-text"
SCREENS = ("record", "observe", "none")
SLACK = 2

_BEGIN = """core.EPISODE_MAX_TIME = 36000000; Math.seedrandom(arguments[0]);
core.setDataMode('train'); core.startEpisodeReal();"""
_READY = ("return typeof genProblem === 'function' && typeof core !== 'undefined' "
          "&& document.readyState === 'complete';")
# After the episode's end MiniWoB covers the page ("START") and would number its elements
# anew: the last observation shows the page as the action left it, with the same refs.
_STATE = """var u = core.getUtterance(); var done = WOB_DONE_GLOBAL;
if (done) { if (core.cover_div) core.cover_div.style.display = 'none'; WOB_EPISODE_ID--; }
var dom = core.getDOMInfo(); if (done) { WOB_EPISODE_ID++; }
var extra = (function () {
""" + page.SNAPSHOT + """
})();
return {utterance: (typeof u === 'string') ? u : u.utterance,
        fields: (typeof u === 'string') ? null : u.fields, dom: dom, extra: extra,
        done: done, raw: WOB_RAW_REWARD_GLOBAL};"""
_PREFIX = re.compile(r"^(?:action\s*:\s*|\d+[.)]\s*)", re.IGNORECASE)


def html_dir() -> Path:
    try:
        from miniwob.selenium_instance import HTML_DIR
    except ImportError as e:
        raise RlanyError(f"the miniwob environment needs the miniwob package ({e})",
                         hint="pip install 'rlany[gui]' (or make install)") from e
    return Path(HTML_DIR) / "miniwob"


class MiniwobEnv:
    name = "miniwob"

    def __init__(self) -> None:
        self.tab: str | None = None
        self.gen = -1
        self._release = None
        self.spec: dict = {}

    # -- protocol ----------------------------------------------------------------------
    def reset(self, task: Task) -> str | Observation:
        problems = self.validate(task.spec)
        if problems:
            raise RlanyError(f"bad miniwob spec: {'; '.join(problems)}")
        self.close()  # a tab of an earlier episode shows another page
        self.spec = {"max_steps": PLANS.get(task.spec["task"], (3,))[0] + SLACK,
                     "screens": "record", **task.spec}
        self.url = (html_dir() / f"{self.spec['task']}.html").as_uri()
        self.history: list[str] = []  # actions executed in the page, listed form
        self.ran: list[acts.Act | None] = []  # the same as read: replayed as they ran
        self.steps, self.begun, self.retries, self.fields = 0, False, 0, None
        self.pointer = list(acts.POINTER)
        try:
            self._observe()
        except BaseException:
            self.close()  # the tab goes back to the pool
            raise
        text = self._text()
        if self.spec.get("hint"):
            text = text.replace("\nPage elements:", f"\nHint: {self.spec['hint']}\n"
                                "Page elements:", 1)
        if self.spec["screens"] == "observe":
            return Observation(text=text, images=(self.screen,))
        return text

    def step(self, response: str) -> StepResult:
        self.steps += 1
        read, why = read_action(self._parse, response)
        action, act, info, error = read or (None, None, {"parse": "error"}, why)
        good = set(self._expert()) if self.spec["task"] in PLANS else None
        before, retries = self.screen, self.retries
        if action is not None:
            error = self._safely(lambda: self._act(act))
            self.history.append(action)
            self.ran.append(act)
        if error:
            info["action_error"] = error
        self._observe()
        done = self.state["done"] or self.steps >= self.spec["max_steps"]
        success = bool(self.state["done"]) and (self.state["raw"] or 0) > 0
        if good is not None:
            info["label"] = 1 if action in good else -1
        if self.spec["screens"] != "none":
            info["screens"] = [[before], [self.screen]]
        if self.retries > retries:
            info["browser_retries"] = self.retries - retries
        if done:
            self.close()
            obs = page.render(self.state["utterance"], self.rows, []).rsplit(
                "\nAdmissible actions:", 1)[0]
        else:
            said = f"Error: {error}\n" if error else "" if action else "Nothing happens.\n"
            obs = said + self._text()
        images = (self.screen,) if self.spec["screens"] == "observe" else ()
        return StepResult(obs=obs, done=done, success=success, action=action, info=info,
                          images=images)

    def state_key(self, observation: str) -> str:
        """The page as listed (from its `Instruction:` line), without the feedback on the
        last action before it and without the first page's hint."""
        page_text = observation[max(observation.find("Instruction: "), 0):]
        hint = self.spec.get("hint")
        return page_text.replace(f"\nHint: {hint}\nPage elements:", "\nPage elements:", 1) \
            if hint else page_text

    def describe(self, task: Task) -> str:
        spec = task.spec
        what = PLANS.get(spec["task"], (0, "a MiniWoB web task"))[1]
        hint = f" Hint: {spec['hint']}" if spec.get("hint") else ""
        steps = spec.get("max_steps", PLANS.get(spec["task"], (3,))[0] + SLACK)
        return (f"MiniWoB page {spec['task']} (seed {spec.get('seed')}): {what}. "
                f"Step limit: {steps}.{hint}")

    def validate(self, spec: dict) -> list[str]:
        if not isinstance(spec, dict):
            return ["spec must be an object"]
        problems = []
        name = spec.get("task")
        if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9-]+", name) \
                or not (html_dir() / f"{name}.html").is_file():
            problems.append(f"spec.task must name a MiniWoB page (e.g. click-button), "
                            f"got {str(name)[:60]!r}")
        seed = spec.get("seed")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
            problems.append("spec.seed must be an integer in 0..2^31-1")
        steps = spec.get("max_steps", 1)
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 50:
            problems.append("spec.max_steps must be an integer in 1..50")
        if spec.get("screens", "record") not in SCREENS:
            problems.append(f"spec.screens must be one of {', '.join(SCREENS)}")
        if not isinstance(spec.get("hint", ""), str):
            problems.append("spec.hint must be a string")
        unknown = set(spec) - {"task", "seed", "max_steps", "screens", "hint"}
        if unknown:
            problems.append(f"unknown spec keys {sorted(unknown)}")
        return problems

    def choices(self) -> list[str]:
        return list(self.actions)

    def expert_action(self) -> str | None:
        """The next action of a shortest plan (None: no expert for this task, or done)."""
        plan = self._expert()
        return plan[0] if plan else None

    def edits(self, spec: dict, direction: str) -> list[Edit]:
        """The neighbouring task on each ladder (same seed), and the step limit moved by one."""
        name, out = spec["task"], []
        least = PLANS.get(name, (1,))[0]
        steps = spec.get("max_steps", least + SLACK)
        slack = max(0, steps - least)
        for ladder in LADDERS:
            if name in ladder:
                k = ladder.index(name) + (1 if direction == "harder" else -1)
                if 0 <= k < len(ladder) and ladder[k] != name:
                    new = ladder[k]
                    spec2 = {**spec, "task": new, "max_steps": PLANS[new][0] + slack}
                    out.append(Edit(f"task: {name} -> {new}", spec2))
        moved = steps - 1 if direction == "harder" else steps + 1
        if least <= moved <= 50:
            out.append(Edit(f"step limit: {steps} -> {moved}", {**spec, "max_steps": moved}))
        unique = {}
        for e in out:
            unique.setdefault(str(sorted(e.spec.items())), e)
        return list(unique.values())[:8]

    def close(self) -> None:
        """Give the tab back to the browser's pool (also done when the env is collected)."""
        if self._release is not None:
            self._release()
            self._release, self.tab = None, None

    # -- the page ----------------------------------------------------------------------
    def _text(self) -> str:
        return page.render(self.state["utterance"], self.rows, self.actions)

    def _expert(self) -> list[str]:
        if self.state["done"]:
            return []
        return expert(self.spec["task"], self.fields, self.rows, self.history)

    def _parse(self, response: str) -> tuple[str | None, acts.Act | None, dict, str | None]:
        """(the action in its listed form or None, the action as read, how it was read,
        what is wrong with a call that names an action but cannot be read). A number or a
        listed line first, else BrowserGym's call or our plain form exactly as answered
        (any ref, any text: `type "keneth"` types keneth even where only KENETH is listed),
        else the nearest listed line."""
        lines = [ln.strip() for ln in response.strip().splitlines() if ln.strip()]
        raw = _PREFIX.sub("", lines[-1]).strip() if lines else ""
        act, error = acts.from_call(raw)
        how = "call"
        if act is None and not error:
            found, info = parse_action(response, self.actions)
            listed = acts.from_plain(found)[0] if found is not None else None
            if info["parse"] == "number" or (found is not None and found == raw):
                return found, listed, info, None
            act, error = acts.from_plain(raw)
            if act is None and not error:
                act, error = acts.from_plain(raw.rstrip("."))
            if act is None and not error:  # the nearest listed line, or none
                return found, listed, info, None
            how = "plain"
        if error:
            return None, None, {"parse": "bad call"}, error
        (act.text + "".join(act.options)).encode()  # text a page can be sent (no surrogate)
        return acts.show(act, self.rows), act, {"parse": how}, None

    def _observe(self) -> None:
        def read():
            state = browser().driver.execute_script(_STATE)
            shot = self._shot() if self.spec["screens"] != "none" else None
            return state, shot

        self.state, self.screen = self._safely(read)
        self.rows = page.elements(self.state["dom"] or {}, self.state.get("extra") or {})
        if self.fields is None:  # the instruction's fields: MiniWoB's, or its extractor's
            self.fields = list((self.state.get("fields") or {}).items()) or \
                _extract(self.spec["task"], self.state["utterance"])
        self.actions = page.admissible(self.rows, self.fields)

    def _shot(self) -> str:
        from selenium.webdriver.common.by import By

        return save_screen(browser().driver.find_element(By.ID, "wrap").screenshot_as_png)

    def _act(self, act: acts.Act | None) -> str | None:
        """Do the action in the page; None, or the page's error in one line."""
        if act is None:  # a listed line that does not read as an action: say so, go on
            return "the action cannot be run (it reads as no action)"
        return acts.run(browser().driver, act, self.pointer)

    def _attach(self) -> None:
        """Switch to this episode's tab (a dead browser's tab: a new one), begin the
        episode if it has not begun there, replaying its actions."""
        b = browser()
        if self.tab is not None and self.gen == b.generation:
            b.driver.switch_to.window(self.tab)
        else:
            self.close()
            self.tab, self.gen, self.begun = b.take_tab(self.url), b.generation, False
            self._release = weakref.finalize(self, b.give_back, self.tab, self.gen)
        if self.begun:
            return
        for _ in range(250):
            if b.driver.execute_script(_READY):
                break
            time.sleep(0.02)
        else:
            from selenium.common.exceptions import TimeoutException

            raise TimeoutException(f"the page {self.url} did not load")
        b.driver.execute_script(_BEGIN, self.spec["seed"])
        for _ in range(50):
            if b.driver.execute_script("return WOB_TASK_READY;"):
                break
            time.sleep(0.02)
        b.driver.execute_script("core.getDOMInfo();")  # numbers the elements (refs)
        self.pointer = list(acts.POINTER)
        for act in self.ran:  # as they ran: the same refs, in the same order
            self._act(act)
            b.driver.execute_script("core.getDOMInfo();")
        self.begun = True

    def _safely(self, fn):
        """Run fn in this episode's tab; if the browser fails, restart it and replay once.
        Only the browser's failures (`_browser_failures`): a bug of ours is raised as is."""
        from rlany.console import info as say

        try:
            self._attach()
            return fn()
        except _browser_failures() as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            say(f"miniwob: the browser failed ({type(e).__name__}: {first}); restarting it "
                 f"and replaying the episode ({self.spec['task']} seed {self.spec['seed']})")
            browser().restart()
            self.retries += 1
            self._attach()
            return fn()


def _browser_failures() -> tuple[type[BaseException], ...]:
    """What a failed browser raises: WebDriver's errors, and a lost connection to it."""
    from http.client import HTTPException

    from selenium.common.exceptions import WebDriverException
    from urllib3.exceptions import HTTPError

    return WebDriverException, HTTPError, HTTPException, ConnectionError


def _extract(task: str, utterance: str) -> list:
    from miniwob.fields import get_field_extractor

    return list(get_field_extractor(task)(utterance))


def make_tasks(n: int, seed: int, tasks: str = DEFAULT_TASKS, slack: int = SLACK,
               screens: str = "record", split: str = "train", prefix: str = "web") -> list[Task]:
    """Random pages of the given MiniWoB tasks (comma list, default the five easiest kinds):
    each task draws a page seed; max_steps is the expert's most steps + slack."""
    chosen = [t.strip() for t in str(tasks).split(",") if t.strip()]
    if not chosen or set(chosen) - set(PLANS):
        raise RlanyError(f"tasks must be a comma list of {', '.join(PLANS)}")
    if screens not in SCREENS or not isinstance(slack, int) or slack < 0:
        raise RlanyError(f"need screens in {', '.join(SCREENS)} and slack >= 0")
    rng, out = random.Random(seed), []
    for k in range(n):
        name = rng.choice(chosen)
        spec = {"task": name, "seed": rng.randrange(2**31),
                "max_steps": PLANS[name][0] + slack, "screens": screens}
        task_id = f"{prefix}-{seed}-{k:04d}"
        out.append(Task(task_id=task_id, env="miniwob", spec=spec, prompt=PROMPT,
                        lineage=Lineage(root_id=task_id), split=split))
    return out
