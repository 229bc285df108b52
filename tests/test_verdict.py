"""--verdict constrained: free reasoning, then a verdict decoded as exactly \\boxed{+1} or
\\boxed{-1}, continuing the same assistant message (prompts.generate_verdicts)."""

from __future__ import annotations

import json

import pytest

from rlany.chat import render
from rlany.engines.base import Completion, EngineConfig, EngineStats, Request, Result, Sampling
from rlany.engines.fake import FakeEngine
from rlany.prompts import (
    VERDICT_CHOICES,
    VERDICT_STOP,
    generate_verdicts,
    judge_messages,
    parse_verdict,
)


def judge_requests(steps: int = 3, m: int = 4, max_tokens: int = 24,
                   logprobs: bool = False) -> list[Request]:
    return [Request(judge_messages(f"put apple {k} in the fridge", [], f"you see apple {k}",
                                   "take apple 1", "You pick up the apple."),
                    Sampling(n=m, max_tokens=max_tokens, temperature=1.0, seed=k,
                             logprobs=logprobs))
            for k in range(steps)]


@pytest.fixture(scope="module")
def hf(tiny_model):
    from rlany.engines.hf import HfEngine
    return HfEngine(EngineConfig(kind="hf", model=tiny_model, dtype="float32"))


def test_tiny_model_verdicts_are_all_readable_only_when_constrained(hf):
    free = [c for r in generate_verdicts(hf, judge_requests(), "free") for c in r.completions]
    con = [c for r in generate_verdicts(hf, judge_requests(), "constrained")
           for c in r.completions]
    assert len(free) == len(con) == 12
    assert sum(parse_verdict(c.text) == 0 for c in free) >= 10   # a random model rambles
    assert all(parse_verdict(c.text) != 0 for c in con)
    eos = hf.tokenizer.eos_token_id
    for c in con:
        verdict = next(v for v in VERDICT_CHOICES if c.text.endswith(v))
        canon = hf.tokenizer(verdict, add_special_tokens=False)["input_ids"]
        # the verdict in the tokenizer's own tokens, then EOS; the ids spell the text
        assert c.token_ids[-len(canon) - 1:] == canon + [eos], c.text
        assert c.finish_reason == "stop" and hf.decode(c.token_ids) == c.text
        assert VERDICT_STOP not in c.text[:-len(verdict)]


def test_verdict_logprobs_equal_a_forward_pass_over_both_phases(hf):
    """The reasoning ids, the verdict ids and their log-probs are exactly what the judge
    was fed: a trainer's forward pass over prompt + token_ids gives the same log-probs."""
    import torch

    requests = judge_requests(steps=2, m=2, max_tokens=12, logprobs=True)
    for request, result in zip(requests, generate_verdicts(hf, requests, "constrained")):
        prompt = render(hf.tokenizer, request.messages)
        assert result.prompt_token_ids == prompt
        for c in result.completions:
            assert len(c.logprobs) == len(c.token_ids)
            with torch.no_grad():
                logits = hf.net(torch.tensor([prompt + c.token_ids])).logits[0]
            want = torch.log_softmax(logits[len(prompt) - 1:-1].float(), -1).gather(
                -1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert c.logprobs == pytest.approx(want.tolist(), abs=1e-4)


def test_hf_stop_string_keeps_the_ids_up_to_the_token_that_completed_it(hf):
    (res,) = hf.generate([Request([{"role": "user", "content": "say something"}],
                                  Sampling(n=8, max_tokens=30, temperature=1.0, seed=3,
                                           stop=("e",)))])
    stopped = [c for c in res.completions if c.stop_reason == "e"]
    assert stopped
    for c in stopped:
        full = hf.decode(c.token_ids)
        assert "e" in full and "e" not in hf.decode(c.token_ids[:-1])
        assert c.text == full[:full.find("e")] and c.finish_reason == "stop"


class PieceEngine:
    """Token ids index VOCAB; a request's scripted phase-1 output is given by its last
    message. Phase 2 (choices) answers the second choice, then EOS (id 0)."""

    VOCAB = ["<eos>", "ok", " s", "o \\", "boxed{", "+1}", "Verdict", ": -1", " more",
             "\\boxed{+1}", "\\boxed{-1}"]
    name, model = "pieces", "pieces"

    def __init__(self):
        self.stats, self.asked = EngineStats(), []

    def decode(self, ids: list[int]) -> str:
        return "".join(self.VOCAB[i] for i in ids if i)

    def generate(self, requests):
        self.asked.append(list(requests))
        results = []
        for r in requests:
            if r.sampling.choices:
                ids, stop = [self.VOCAB.index(r.sampling.choices[1]), 0], None
                finish = "stop"
            else:
                ids, finish = json.loads(r.messages[-1]["content"])
                stop = next((s for s in r.sampling.stop if s in self.decode(ids)), None)
            text = self.decode(ids)
            text = text[:text.find(stop)] if stop else text
            results.append(Result([7, 7], [Completion(text, ids, finish, [-0.1 * (k + 1) for k
                                                                          in range(len(ids))],
                                                      stop_reason=stop)]))
        self.stats.add(requests, results, 0.0)
        return results


def test_reasoning_prefix_is_cut_at_token_boundaries_and_kept_verdicts_stay():
    eng = PieceEngine()
    scripts = [([1, 2, 3, 4], "stop"),      # "ok so \boxed{": stopped there
               ([1, 6, 7, 0], "stop"),      # "okVerdict: -1" then EOS: readable, kept
               ([1, 8, 0], "stop"),         # "ok more" then EOS: no verdict
               ([1, 8], "length")]          # ran out of tokens
    requests = [Request([{"role": "user", "content": json.dumps(s)}],
                        Sampling(n=1, logprobs=True, seed=5)) for s in scripts]
    out = [r.completions[0] for r in generate_verdicts(eng, requests)]
    first, second = eng.asked
    assert all(VERDICT_STOP in r.sampling.stop for r in first)
    # the token "o \" holds reasoning and the start of the stop string: dropped with it
    assert [r.continuation for r in second] == [(1, 2), (1, 8), (1, 8)]
    assert [r.continuation_text for r in second] == ["ok s", "ok more", "ok more"]
    assert all(r.sampling.choices == VERDICT_CHOICES and r.sampling.n == 1 for r in second)
    assert out[0].text == "ok s\\boxed{-1}" and out[0].token_ids == [1, 2, 10, 0]
    assert out[0].logprobs == pytest.approx([-0.1, -0.2, -0.1, -0.2])
    assert out[1].text == "okVerdict: -1" and out[1].token_ids == [1, 6, 7, 0]
    assert out[2].token_ids == [1, 8, 10, 0] and out[3].token_ids == [1, 8, 10, 0]
    assert all(c.finish_reason == "stop" and parse_verdict(c.text) == -1 for c in out)


def test_fake_engine_keeps_scripted_verdicts_and_constrains_the_rest():
    script = ["looks right \\boxed{+1}", "wrong object \\boxed{-1}", "no idea", "\\boxed{-1}"]
    eng = FakeEngine.from_rules([{"responses": script}])
    requests = judge_requests(steps=2, m=4)
    free = generate_verdicts(eng, requests, "free")
    con = generate_verdicts(eng, requests, "constrained")
    for f, c in zip(free, con):
        texts = [x.text for x in f.completions]
        assert sorted(texts) == sorted(script)
        for a, b in zip(f.completions, c.completions):
            if parse_verdict(a.text):
                assert b.text == a.text   # the scripted verdict survives the two phases
            else:
                assert b.text.startswith(a.text) and parse_verdict(b.text) != 0


def test_unknown_verdict_mode_is_refused():
    with pytest.raises(ValueError, match="verdict mode"):
        generate_verdicts(FakeEngine(lambda r, k: "x"), judge_requests(1), "loose")


def test_hostile_text_is_sanitized_and_counted():
    eng = FakeEngine(lambda r, k: "bad \ud800 text" if k == 0 else "fine")
    (res,) = eng.generate([Request([{"role": "user", "content": "hi"}], Sampling(n=2))])
    assert [c.text for c in res.completions] == ["bad \ufffd text", "fine"]
    assert eng.stats.sanitized == 1
    json.dumps(res.completions[0].text, ensure_ascii=False).encode("utf-8")   # writable
    generate_verdicts(eng, judge_requests(1, m=2))
    assert eng.stats.sanitized == 2


def test_verdict_alone_is_one_prompt_pass_per_step_with_m_readable_samples(hf):
    """--max-tokens 0: no reasoning; each step is one constrained request whose n = m
    samples are the verdicts, each exactly a choice and EOS, with the forward pass's
    log-probs (what train-rm trains on)."""
    import torch

    requests = judge_requests(steps=3, m=4, max_tokens=0, logprobs=True)
    calls = hf.stats.calls
    results = generate_verdicts(hf, requests, "constrained")
    assert hf.stats.calls - calls == 1
    eos = hf.tokenizer.eos_token_id
    for request, result in zip(requests, results):
        assert len(result.completions) == 4
        prompt = render(hf.tokenizer, request.messages)
        for c in result.completions:
            assert c.text in VERDICT_CHOICES and parse_verdict(c.text) != 0
            assert c.token_ids == hf.tokenizer(c.text, add_special_tokens=False)[
                "input_ids"] + [eos]
            with torch.no_grad():
                logits = hf.net(torch.tensor([prompt + c.token_ids])).logits[0]
            want = torch.log_softmax(logits[len(prompt) - 1:-1].float(), -1).gather(
                -1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert c.logprobs == pytest.approx(want.tolist(), abs=1e-4)


def test_verdict_alone_needs_constrained_steps(cli, tmp_path):
    (tmp_path / "t.jsonl").write_text("")
    r = cli("judge", "-i", str(tmp_path / "t.jsonl"), "--max-tokens", "0", "--verdict", "free",
            "--engine", "fake", "--model", "x")
    assert r.returncode == 2 and "needs --verdict constrained" in r.stderr
    assert len(r.stderr.splitlines()) == 1


def test_constrained_choice_probabilities_equal_a_token_by_token_walk(hf):
    """The hf engine picks a choice from one prompt pass and one pass over the choices'
    tokens; its distribution is the token-by-token trie walk's (checked against separate
    full forward passes), and its greedy pick is the greedy walk's."""
    import torch

    choices = ("go to shelf 1", "go to shelf 2", "go to drawer 1", "look")
    messages = [{"role": "user", "content": "pick an action"}]
    prompt = render(hf.tokenizer, messages)
    eos = hf.tokenizer.eos_token_id
    seqs = [hf.tokenizer(c, add_special_tokens=False)["input_ids"] + [eos] for c in choices]

    def next_logits(prefix):
        with torch.no_grad():
            return hf.net(torch.tensor([prompt + prefix])).logits[0, -1].float()

    def walk(q, temperature):
        p = 1.0
        for t in range(len(q)):
            kids = sorted({o[t] for o in seqs if len(o) > t and o[:t] == q[:t]})
            z = next_logits(q[:t])[kids]
            if temperature == 0:
                p *= float(kids[int(z.argmax())] == q[t])
            elif len(kids) > 1:
                p *= float(torch.softmax(z / temperature, -1)[kids.index(q[t])])
        return p

    want = [walk(q, 2.0) for q in seqs]
    assert sum(want) == pytest.approx(1.0)
    (got,) = hf.generate([Request(messages, Sampling(n=4000, max_tokens=16, temperature=2.0,
                                                     seed=1, choices=choices))])
    freq = [sum(c.text == ch for c in got.completions) / 4000 for ch in choices]
    assert freq == pytest.approx(want, abs=0.03)
    greedy = [walk(q, 0) for q in seqs]
    (top,) = hf.generate([Request(messages, Sampling(n=1, max_tokens=16, temperature=0,
                                                     choices=choices, logprobs=True))])
    assert top.completions[0].text == choices[greedy.index(1.0)]
    c = top.completions[0]
    want_lp = [float(torch.log_softmax(next_logits(c.token_ids[:t]), -1)[c.token_ids[t]])
               for t in range(len(c.token_ids))]
    assert c.logprobs == pytest.approx(want_lp, abs=1e-4)
