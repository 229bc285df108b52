"""`alfworld`: real TextWorld and ALFWorld games played through TextWorld, from disk.

spec:
    {"game_file": path to a compiled game: TextWorld `.z8` / `.ulx` (with the `.json`
                  TextWorld writes beside it), or ALFWorld's `game.tw-pddl`,
     "max_steps": int (default 50),
     "hint": str (optional; shown under the goal, a rewriter may add or change it)}

Each turn the agent sees the game's feedback and the numbered admissible commands; a
response is mapped to one of them by `rlany.envs.parse_action` (number, text, prefix,
fuzzy), and anything else answers "Nothing happens." (a response the reading trips over:
"Error: ...", `rlany.envs.read_action`) without touching the game. The
episode succeeds when the game is won; it ends when it is won or lost or at `max_steps`.
Score announcements and the end-of-game banner are cut from what the agent (and the
judge) sees, so the last observation does not reveal the outcome.

Step labels (info["label"]) come from the game's own expert: TextWorld re-plans its
walkthrough (`policy_commands`) after every command (a quest dependency tree for TextWorld
games, the PDDL planner for ALFWorld's). A step is +1 when it wins the game or makes that
walkthrough shorter (progress toward winning), -1 when it does not (a detour, a no-op, a
command that makes the game unwinnable) and for an unparseable response. Games without a
walkthrough leave parsed steps unlabelled. `edits(spec, direction)` only moves the step
limit (harder: less slack over the walkthrough's length; easier: more).

Tasks: `rlany envs make-tasks alfworld --n 8 --seed 0` compiles that many TextWorld games
offline (knobs: rooms, objects, quest_length, game_dir), so it needs only
`pip install textworld`. `--knob games=DIR` instead makes one task per game already on
disk under DIR (`*.z8`, `*.ulx`, `game.tw-pddl`): point it at ALFWorld's data
(`alfworld-download` puts it in ~/.cache/alfworld) to train on the real benchmark; the
`.tw-pddl` path also needs `pip install alfworld`, and was not run here (no data offline).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from rlany.envs import Edit, StepResult, parse_action, read_action
from rlany.errors import RlanyError
from rlany.files.records import Lineage, Task

PROMPT = ("You are playing a text adventure game. Each turn, answer with exactly one "
          "admissible command, either its number or its text.")
SUFFIXES = (".z8", ".ulx", ".tw-pddl")
DEFAULT_MAX_STEPS = 50
_NOISE = re.compile(
    r"^\s*(?:your score has just gone (?:up|down) by .*|\*+\s*the end\s*\*+|you scored .*|"
    r"would you like to restart.*|>\s*|[\s_|\\/$]+)$", re.IGNORECASE)


def clean_feedback(text: str) -> str:
    """The game's text without ASCII-art banners, score announcements and end-of-game lines."""
    lines = [ln.rstrip() for ln in text.splitlines() if not _NOISE.match(ln)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _textworld():
    try:
        import textworld
    except ImportError as e:
        raise RlanyError(f"the alfworld environment needs TextWorld ({e})",
                         hint="pip install 'rlany[textworld]' (or pip install textworld)") from e
    return textworld


def _start(game_file: str):
    textworld = _textworld()
    infos = textworld.EnvInfos(admissible_commands=True, won=True, lost=True, objective=True,
                               description=True, policy_commands=True, feedback=True)
    wrappers = []
    if game_file.endswith(".tw-pddl"):
        try:
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        except ImportError as e:
            raise RlanyError(f"ALFWorld games (.tw-pddl) need the alfworld package ({e})",
                             hint="pip install alfworld") from e
        wrappers = [AlfredDemangler(), AlfredInfos]
    with warnings.catch_warnings():  # jericho: "unsupported game" (TextWorld lists commands)
        warnings.simplefilter("ignore")
        env = textworld.start(game_file, request_infos=infos, wrappers=wrappers)
        return env, env.reset()


class AlfworldEnv:
    name = "alfworld"

    def __init__(self) -> None:
        self.game = None

    def reset(self, task: Task) -> str:
        problems = self.validate(task.spec, check_solvable=False)
        if problems:
            raise RlanyError(f"bad alfworld spec: {'; '.join(problems)}")
        self.close()
        self.spec = task.spec
        self.game, state = _start(task.spec["game_file"])
        self.admissible = _commands(state)
        self.policy = list(state.get("policy_commands") or [])  # the expert's plan from here
        self.steps = 0
        goal = state.get("objective") or ""
        hint = f"\nHint: {task.spec['hint']}" if task.spec.get("hint") else ""
        room = clean_feedback(state.get("description") or "") or clean_feedback(state.feedback)
        return self._observe(f"Your task is to: {goal.strip()}{hint}\n\n{room}")

    def step(self, response: str) -> StepResult:
        self.steps += 1
        read, why = read_action(parse_action, response, self.admissible)
        action, info = read or (None, {"parse": "error", "invalid_action": why})
        won = lost = False
        if action is None:
            feedback = f"Error: {why}" if why else "Nothing happens."
            info = {**info, "label": -1}
        else:
            state, _, _ = self.game.step(action)
            feedback = clean_feedback(state.feedback) or "Nothing happens."
            won, lost = bool(state.get("won")), bool(state.get("lost"))
            self.admissible = _commands(state)
            before, self.policy = self.policy, list(state.get("policy_commands") or [])
            if before or won:  # labelled where the game has an expert
                progress = won or (not lost and 0 < len(self.policy) < len(before))
                info = {**info, "label": 1 if progress else -1}
        done = won or lost or self.steps >= int(self.spec.get("max_steps", DEFAULT_MAX_STEPS))
        if done:
            self.close()
        return StepResult(obs=feedback if done else self._observe(feedback), done=done,
                          success=won, action=action, info=info)

    def choices(self) -> list[str]:
        return list(self.admissible)

    def expert_action(self) -> str | None:
        """The next command of the game's expert plan (None where the game has none)."""
        return self.policy[0] if self.policy else None

    def _observe(self, feedback: str) -> str:
        acts = "\n".join(f"{k + 1}. {a}" for k, a in enumerate(self.admissible))
        return f"{feedback}\nAdmissible commands:\n{acts}"

    def close(self) -> None:
        if self.game is not None:
            self.game.close()
            self.game = None

    def describe(self, task: Task) -> str:
        spec = task.spec
        hint = f" Hint: {spec['hint']}" if spec.get("hint") else ""
        return (f"A TextWorld game ({Path(spec['game_file']).name}); "
                f"{spec.get('objective', 'goal stated in the game')}. Step limit: "
                f"{spec.get('max_steps', DEFAULT_MAX_STEPS)}.{hint} Editable: max_steps, hint.")

    def edits(self, spec: dict, direction: str) -> list[Edit]:
        """Step-limit edits only: the walkthrough's length bounds how far it may go down."""
        if direction not in ("harder", "easier"):
            raise ValueError(f"direction must be harder or easier, got {direction!r}")
        if self.validate(spec, check_solvable=False):
            return []
        game_env, state = _start(spec["game_file"])
        game_env.close()
        need, limit = len(state.get("policy_commands") or []), int(spec.get("max_steps",
                                                                             DEFAULT_MAX_STEPS))
        if not need:
            return []
        new = max(need, limit - max(1, (limit - need) // 2)) if direction == "harder" else \
            limit + max(2, limit // 4)
        edit = Edit(description=f"step limit: {limit} -> {new}", spec={**spec, "max_steps": new})
        return [edit] if new != limit and not self.validate(edit.spec) else []

    def validate(self, spec: dict, check_solvable: bool = True) -> list[str]:
        if not isinstance(spec, dict):
            return ["spec must be an object"]
        game = spec.get("game_file")
        if not isinstance(game, str) or not game.endswith(SUFFIXES):
            return [f"spec.game_file must be a path ending in {', '.join(SUFFIXES)}"]
        if not Path(game).is_file():
            return [f"spec.game_file {game} does not exist"]
        steps = spec.get("max_steps", DEFAULT_MAX_STEPS)
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            return ["spec.max_steps must be a positive integer"]
        if "hint" in spec and not isinstance(spec["hint"], str):
            return ["spec.hint must be a string"]
        if not check_solvable:
            return []
        # solvable within the step limit: the game's own walkthrough wins in time
        game_env, state = _start(game)
        try:
            plan = list(state.get("policy_commands") or [])
            if not plan:
                return []  # no walkthrough to check with (e.g. ALFWorld without its expert)
            if len(plan) > steps:
                return [f"the walkthrough needs {len(plan)} steps, more than max_steps {steps}"]
            for command in plan:
                state, _, done = game_env.step(command)
                if done:
                    break
            return [] if state.get("won") else ["the game's walkthrough does not win it"]
        finally:
            game_env.close()


def _commands(state) -> list[str]:
    commands = state.get("admissible_commands")
    if not commands:
        raise RlanyError("the game lists no admissible commands (a TextWorld game needs the "
                         ".json TextWorld writes beside the compiled file)")
    return [c for c in commands if c not in ("inventory", "look")] + ["look", "inventory"]


def make_tasks(n: int, seed: int, split: str = "train", games: str | None = None,
               game_dir: str = "textworld_games", rooms: int = 2, objects: int = 4,
               quest_length: int = 2, max_steps: int = 20, prefix: str = "tw") -> list[Task]:
    """Compile n TextWorld games offline (or, with games=DIR, use n games found there)."""
    from rlany.envs import check_knob

    for knob, value in (("rooms", rooms), ("objects", objects), ("quest_length", quest_length),
                        ("max_steps", max_steps)):
        check_knob(knob, value, 1)
    files = _found(games, n, seed) if games else _compile(n, seed, Path(game_dir), rooms,
                                                          objects, quest_length)
    tasks = []
    for k, path in enumerate(files):
        task_id = f"{prefix}-{seed}-{k:04d}"
        spec = {"game_file": str(path.resolve()), "max_steps": max_steps}
        tasks.append(Task(task_id=task_id, env="alfworld", spec=spec, prompt=PROMPT,
                          split=split, lineage=Lineage(root_id=task_id)))
    return tasks


def _found(games: str, n: int, seed: int) -> list[Path]:
    import random

    root = Path(games)
    if not root.is_dir():
        raise RlanyError(f"games={games} is not a directory")
    files = sorted(p for p in root.rglob("*") if p.suffix in (".z8", ".ulx")
                   or p.name.endswith(".tw-pddl"))
    if len(files) < n:
        raise RlanyError(f"found {len(files)} games under {games}, asked for {n}")
    random.Random(seed).shuffle(files)
    return files[:n]


def _compile(n: int, seed: int, out: Path, rooms: int, objects: int,
             quest_length: int) -> list[Path]:
    _textworld()
    from textworld.generator import GameOptions, compile_game, make_game

    out.mkdir(parents=True, exist_ok=True)
    files = []
    for k in range(n):
        game_seed = seed * 10_000 + k
        path = out / f"tw-r{rooms}-o{objects}-q{quest_length}-s{game_seed}.z8"
        if not path.exists():  # compiled games are reused: same knobs and seed, same game
            options = GameOptions()
            options.seeds = game_seed
            options.nb_rooms, options.nb_objects = rooms, objects
            options.quest_length = quest_length
            options.path = str(path)
            options.force_recompile = True
            compile_game(make_game(options), options)
        files.append(path)
    return files
