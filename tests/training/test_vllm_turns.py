"""Chat turns through TRL's vLLM generation: each turn capped on its own and stopped at every end-of-text id; with
several training processes on a vLLM server, every process makes the same calls and gets its own completions."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from nego.market.marketplace import Job
from nego.training.chat_rollout import ChatFactory, ChatPolicy
from nego.training.rollout import split_scenarios
from nego.training.runner import EpisodeRunner
from nego.training.vllm_turns import Lockstep

from .chat_models import END, EOS, tiny_chat_model
from .fake_vllm import FakeVLLMClient, fake_vllm_generation, reply_for

ONE_PROCESS = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=None), process_index=0, is_main_process=True)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_chat_model(tmp_path_factory.mktemp("m"))
    return path, AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_each_turn_is_capped_on_its_own_and_stops_at_every_end_id(chat_model):
    _, model, tok = chat_model
    ends = {tok.convert_tokens_to_ids(END), tok.convert_tokens_to_ids(EOS)}
    client = FakeVLLMClient(reply_for(tok, tok.convert_tokens_to_ids(END)))
    vllm = fake_vllm_generation(ONE_PROCESS, tok, client, max_completion_length=4096)
    policy = ChatPolicy(model, tok, max_new=4, vllm=vllm)
    jobs = [Job(sc, "learner", "tft", seed) for seed, sc in enumerate(split_scenarios("dev", 4, 3))]
    with EpisodeRunner({"learner": ChatFactory("learner", policy, 1.0)}) as runner:
        rollouts = runner.rollouts(jobs)
    turns = sum(r.seller_turns for r in rollouts)
    assert 0 < len(client.calls) < turns  # negotiations waiting together share a call
    assert {(c.max_tokens, c.stop_token_ids) for c in client.calls} == {(4, tuple(sorted(ends)))}
    assert vllm.max_completion_length == 4096 and "stop_token_ids" not in (vllm.generation_kwargs or {})
    for r in rollouts:
        trace = r.trace
        trained = [lp for lp, m in zip(trace.logprobs, trace.mask, strict=True) if m]
        assert trained and set(trained) == {-0.5}  # vLLM's log-probabilities of the ids it chose
        assert trace.own_tokens <= 4 * r.seller_turns and trace.completion_ids[-1] in ends


def test_a_process_agrees_on_the_largest_batch_and_keeps_joining_until_all_are_done():
    counts = iter([[3, 5], [0, 2], [0, 0]])  # what the other process reports, call by call
    gathered: list[list[int]] = []

    def gather(mine: list[int]) -> list[int]:
        gathered.append(mine)
        return next(counts)

    step = Lockstep(gather, filler=[9])
    assert step.pad([[1], [2], [3]]) == [[1], [2], [3], [9], [9]]
    sent: list[list[list[int]]] = []
    turns = SimpleNamespace(lockstep=step, filler_rows=0, _call=lambda rows: sent.append(rows))
    from nego.training.vllm_turns import VLLMTurns

    assert VLLMTurns.drain(turns) == 1 and sent == [[[9], [9]]] and turns.filler_rows == 2
    assert gathered == [[3], [0], [0]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_training_processes_on_a_vllm_server_make_the_same_calls_and_get_their_own_completions(
    chat_model, tmp_path
):
    path = chat_model[0]
    out = tmp_path / "out"
    out.mkdir()
    accelerate = Path(sys.executable).with_name("accelerate")
    # --multi_gpu is accelerate's multi-process (torchrun) launcher; the processes themselves run on CPU with gloo
    cmd = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]
    cmd += [str(Path(__file__).with_name("lockstep_run.py")), str(path), str(out)]
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(2)]
    # the same calls with the same number of prompts in every process, though they played 4 and 6 negotiations
    assert ranks[0]["sent"] == ranks[1]["sent"] and len(ranks[0]["sent"]) >= 3
    assert [len(r["seller_turns"]) for r in ranks] == [4, 6] and ranks[0]["filler_rows"] + ranks[1]["filler_rows"] > 0
    server = ranks[0]["server_calls"]
    assert [c["prompts"] for c in server] == [2 * n for n in ranks[0]["sent"]]
    assert {(c["max_tokens"], tuple(c["stop_token_ids"])) for c in server} == {(24, tuple(ranks[0]["stop_ids"]))}
    for r in ranks:
        # every reply went to the negotiation that asked for it: each trained run is the reply to what precedes it
        assert [len(runs) for runs in r["runs"]] == r["seller_turns"]
        assert all(all(runs) for runs in r["runs"])
