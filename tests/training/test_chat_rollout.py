"""Chat-format GRPO for real models, exercised on a tiny random Qwen2-shaped model with a test-built chat template."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest
from nego.agents.llm.chat_layout import CHAT_TEMPLATE
from nego.agents.llm.prompts import DEFAULT_TEMPLATE, load_template
from nego.agents.model_registry import lookup, register
from nego.agents.model_specs import LLMSettings, resolve_model_spec
from nego.agents.registry import resolve
from nego.market.marketplace import Job
from nego.market.protocol import run_negotiation
from nego.scenarios.scenario import Role
from nego.training import grpo
from nego.training.chat_rollout import ChatFactory, ChatPolicy, ChatRollout, TemplateError, user_suffix_ids
from nego.training.config import TrainConfig
from nego.training.rollout import split_scenarios
from nego.training.runner import EpisodeRunner

pytestmark = pytest.mark.slow
CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tiny_chat_model(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    corpus = ["The seller offers: price=120, warranty=2y. Rounds left: 3", '{"action": "offer", "offer": {}}'] * 20
    core.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<pad>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<|im_end|>", padding_side="left")
    tok.chat_template = CHAT
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8192,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return tok


def test_rollouts_through_the_market_give_one_sequence_per_negotiation_with_only_sampled_ids_trained(tmp_path):
    from transformers import AutoModelForCausalLM

    tok = _tiny_chat_model(tmp_path / "m")
    suffix = user_suffix_ids(tok, "Rounds left: 2")
    assert tok.decode(suffix).startswith("\n<|im_start|>user\nRounds left: 2<|im_end|>\n<|im_start|>assistant\n")
    policy = ChatPolicy(AutoModelForCausalLM.from_pretrained(tmp_path / "m"), tok, max_new=6)
    jobs = [Job(sc, "learner", "tft", seed) for sc, seed in zip(split_scenarios("dev", 2, 3), [1, 2], strict=True)]
    with EpisodeRunner({"learner": ChatFactory("learner", policy, 1.0)}) as runner:
        played = [(r.trace, r.result) for r in runner.rollouts(jobs)]
    for trace, result in played:
        ids = trace.completion_ids
        assert len(ids) == len(trace.mask) == len(trace.logprobs) and ids[-1] in policy.eos_ids
        own_turns = sum(1 for t in result.turns if t.role.value == "seller")
        runs, cur = [], None
        for i, m in enumerate(trace.mask):
            if m != cur:
                runs.append((m, i))
                cur = m
        assert 1 <= sum(1 for m, _ in runs if m == 1) <= own_turns  # at most one trained run per seller turn
        assert sum(trace.mask) <= own_turns * 6  # no turn past its cap
        user_turns = tok.decode(list(ids)).count("<|im_start|>user")
        assert user_turns == own_turns - 1  # one update between two seller turns


@pytest.mark.parametrize("template", ["negotiator-chat-small-v3", "negotiator-chat-small-v4"])
def test_a_layout_that_withholds_invalid_replies_trains_none_of_their_ids(tmp_path, template):
    from transformers import AutoModelForCausalLM

    tok = _tiny_chat_model(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    policy = ChatPolicy(model, tok, max_new=6, template=template)
    jobs = [Job(sc, "learner", "tft", seed) for sc, seed in zip(split_scenarios("dev", 2, 3), [1, 2], strict=True)]
    with EpisodeRunner({"learner": ChatFactory("learner", policy, 1.0)}) as runner:
        played = [(r.trace, r.result) for r in runner.rollouts(jobs)]
    withheld = sum(t.withheld for t in policy.traces)
    assert withheld > 0 and policy.context_only_share == 0.0  # a random model's replies are invalid
    for trace, result in played:
        attempts = [t for t in result.turns if t.role.value == "seller"]
        text = tok.decode(list(trace.prompt_ids + trace.completion_ids))
        empty = "<|im_start|>assistant\n<|im_end|>"
        # every invalid reply but the episode's last is written as an empty message (v3; v4 writes the last legal
        # reply, empty before the first); the last is trained as sampled
        invalid = sum(1 for t in attempts[:-1] if not t.valid)
        assert text.count(empty) == invalid if template.endswith("v3") else text.count(empty) <= invalid
        trained = sum(trace.mask)
        assert trained <= 6 * (1 + sum(1 for t in attempts[:-1] if t.valid))


def test_a_non_prefix_preserving_template_is_refused(tmp_path):
    tok = _tiny_chat_model(tmp_path / "m")
    tok.chat_template = "{% for m in messages|reverse %}{{ m['content'] }}<|im_end|>{% endfor %}"
    with pytest.raises(TemplateError, match="prefix-preserving"):
        user_suffix_ids(tok, "hello")


def toy_config(tmp_path, **options) -> TrainConfig:
    """A few GRPO steps on the tiny chat model saved at ``tmp_path / "m"``."""
    defaults = dict(
        model=f"hf:{tmp_path / 'm'}",
        out=str(tmp_path / "run"),
        group_size=2,
        scenarios_per_step=1,
        dev_scenarios=1,
        max_tokens=8192,
        eval_every=0,
        save_every=0,
        threads=1,
        time_budget_min=0,
        lr=1e-3,
    )
    return TrainConfig(**{**defaults, **options})


def test_grpo_steps_on_a_chat_model_register_hf_entries(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))
    _tiny_chat_model(tmp_path / "m")
    cfg = toy_config(tmp_path, name="toy", steps=2, train_scenarios=2, max_rounds=2, save_every=1)
    result = grpo.train(cfg, echo=lambda s: None)
    assert result.steps == 2 and (tmp_path / "run" / "checkpoints" / "checkpoint-2").is_dir()
    base, rl = lookup("toy"), lookup("toy-rl")
    assert base.format == rl.format == "hf" and rl.base == "toy" and rl.steps == 2
    assert rl.config["template"] == CHAT_TEMPLATE and rl.config["template_id"] == load_template(CHAT_TEMPLATE).id
    assert rl.config["turn_tokens"] == cfg.turn_tokens
    # a model is played as it was trained: the conversation it saw, its temperature, its cap on one turn
    played = resolve_model_spec("toy-rl", LLMSettings())
    assert played.template.conversational and played.prompt_id == rl.config["template_id"]
    assert played.settings.max_tokens == cfg.turn_tokens
    assert played.settings.temperature == cfg.sampling_temperature == 1.0  # the default for chat models
    assert not played(Role.SELLER, 0).use_tools
    # ... unless the user names another prompt
    register(replace(rl, name="old-rl", config={**rl.config, "template": "negotiator-v1", "template_id": ""}))
    played = resolve_model_spec("old-rl", LLMSettings())
    assert played.prompt_id.startswith("negotiator-v1:") and played.settings.temperature == cfg.sampling_temperature
    assert resolve_model_spec("old-rl", LLMSettings(temperature=0.0)).settings.temperature == 0.0
    mine = tmp_path / "mine.txt"
    mine.write_text((resources.files("nego.agents.llm") / "prompts" / f"{DEFAULT_TEMPLATE}.txt").read_text())
    assert resolve_model_spec("old-rl", LLMSettings(template=str(mine))).prompt_id.startswith("mine:")


def test_a_lora_run_registers_an_adapter_that_plays_on_its_base(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))
    _tiny_chat_model(tmp_path / "m")
    cfg = toy_config(tmp_path, name="toyl", finetune="lora", lora_rank=4, steps=1, train_scenarios=1, max_rounds=1)
    grpo.train(cfg, echo=lambda s: None)
    entry = lookup("toyl-rl")
    assert (Path(entry.path) / "adapter_config.json").is_file()
    factory = resolve_model_spec("toyl-rl", LLMSettings(max_tokens=8))
    sc = split_scenarios("dev", 1, 1)[0]
    result = asyncio.run(run_negotiation(sc, factory(Role.SELLER, 0), resolve("tft")(Role.BUYER, 0)))
    assert result.outcome.turns >= 1


def test_the_memory_plan_caps_the_rows_of_one_generate_call(tmp_path):
    from transformers import AutoModelForCausalLM

    tok = _tiny_chat_model(tmp_path / "m")
    policy = ChatPolicy(AutoModelForCausalLM.from_pretrained(tmp_path / "m"), tok, max_new=4, max_rows=2)
    jobs = [Job(sc, "learner", "tft", seed) for seed, sc in enumerate(split_scenarios("dev", 4, 2))]
    with EpisodeRunner({"learner": ChatFactory("learner", policy, 1.0)}) as runner:
        runner.rollouts(jobs)
    assert policy.generator.engine.stats.largest_batch == 2  # four negotiations in flight, two rows per call
    with pytest.raises(ValueError, match="max_rows"):
        ChatRollout(tok, max_rows=0)
