"""Image observations: a fake GUI env's screenshots reach the policy and the judge, through
the fake engine and, as inline images, through the openai engine; text-only paths refuse."""

from __future__ import annotations

import base64
import struct
import zlib
from pathlib import Path

import pytest

from rlany.chat import images_of, render_text, text_of
from rlany.engines.base import EngineConfig
from rlany.engines.fake import FakeEngine
from rlany.engines.openai import OpenAIEngine
from rlany.envs import Observation, StepResult
from rlany.errors import RlanyError
from rlany.files.records import Task, Trajectory, from_json, to_json
from rlany.stages.judge import JudgeOptions, judge
from rlany.stages.rollout import RolloutOptions, rollout
from test_openai_engine import Stub, server  # noqa: F401  (the stub server fixture)


def png(path: Path, shade: int) -> str:
    """A 2x2 grey PNG, written by hand (no imaging library needed)."""
    raw = b"".join(b"\x00" + bytes([shade] * 2) for _ in range(2))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 0, 0,
                                                                      0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return str(path)


class FakeGui:
    """A screen with a button: clicking it (action `click ok`) twice finishes the task.
    Every observation is a fresh screenshot file plus a short text."""

    name = "fakegui"

    def __init__(self, root: Path):
        self.root = root

    def reset(self, task):
        self.clicks, self.k = 0, 0
        return Observation(text="A dialog with an OK button.", images=(self._shot(),))

    def _shot(self) -> str:
        self.k += 1
        return png(self.root / f"{id(self)}-{self.k}.png", 40 * self.k)

    def step(self, response):
        self.clicks += "click ok" in response
        done = self.clicks == 2 or self.k >= 3
        return StepResult(obs=f"clicked {self.clicks} times", done=done,
                          success=self.clicks == 2, action=response.strip(),
                          images=(self._shot(),))

    def describe(self, task):
        return "click OK twice"

    def validate(self, spec):
        return []


@pytest.fixture
def gui_trajs(tmp_path):
    eng = FakeEngine(lambda req, k: "click ok")
    tasks = [Task(task_id="g0", env="fakegui", spec={}, prompt="Operate the computer.")]
    (group,) = list(rollout(tasks, eng, lambda name: FakeGui(tmp_path),
                            RolloutOptions(n=2, max_steps=3)))
    return eng, group


def test_rollout_sends_the_current_screen_and_records_images(gui_trajs):
    eng, group = gui_trajs
    traj = group[0]
    assert traj.outcome == 1 and len(traj.steps) == 2
    first, second = eng.calls[0][0].messages, eng.calls[1][0].messages
    # turn 1: the screenshot is an image part of the user message, before the text
    assert len(images_of(first[0]["content"])) == 1
    assert text_of(first[0]["content"]).startswith("Operate the computer.")
    # turn 2: only the newest screen is sent; the earlier user message keeps its text
    assert images_of(second[0]["content"]) == [] and isinstance(second[0]["content"], str)
    assert len(images_of(second[-1]["content"])) == 1
    s0, s1 = traj.steps
    assert images_of(first[0]["content"]) == [Path(s0.images[0]).resolve().as_uri()]
    assert s0.next_images == s1.images and len(s1.next_images) == 1
    assert all(Path(p).exists() for s in traj.steps for p in s.images + s.next_images)
    # the record round-trips through JSON with its images
    again = from_json(Trajectory, to_json(traj))
    assert again.steps[1].next_images == s1.next_images


def test_judge_sees_the_screens_before_and_after(gui_trajs):
    _, group = gui_trajs
    eng = FakeEngine(lambda req, k: "\\boxed{+1}")
    (judged,) = list(judge(group, eng, JudgeOptions(m=2)))
    step = group[0].steps[1]
    messages = judged[0].steps[1].judge_messages
    assert images_of(messages[-1]["content"]) == [Path(p).resolve().as_uri()
                                                  for p in step.images + step.next_images]
    assert "the first 1 show the screen at this step" in text_of(messages[-1]["content"])
    assert all(s.score == 1 for j in judged for st in j.steps for s in st.samples)


def test_openai_engine_sends_images_inline(gui_trajs, server):  # noqa: F811
    _, group = gui_trajs
    eng = OpenAIEngine(EngineConfig(kind="openai", model="vlm", base_url=server, timeout_s=5))
    list(judge(group[:1], eng, JudgeOptions(m=1, verdict="free")))
    bodies = [b for path, b in Stub.seen if path.endswith("/chat/completions")]
    assert len(bodies) == len(group[0].steps)            # one request per step
    sent = set()
    for body in bodies:
        parts = body["messages"][-1]["content"]
        urls = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
        assert len(urls) == 2 and all(u.startswith("data:image/png;base64,") for u in urls)
        sent |= {base64.b64decode(u.split(",", 1)[1]) for u in urls}
    # exactly the screenshots of the trajectory, read from disk
    assert sent == {Path(p).read_bytes() for s in group[0].steps for p in s.images + s.next_images}


def test_text_only_rendering_refuses_images(gui_trajs, tiny_model):
    from transformers import AutoTokenizer

    _, group = gui_trajs
    tok = AutoTokenizer.from_pretrained(tiny_model)
    with pytest.raises(RlanyError, match="images"):
        render_text(tok, group[0].steps[0].prompt_messages)
