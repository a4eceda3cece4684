"""The policy kind is chosen once from the config; nothing else in the training wing asks which kind it has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from nego.training.chat_kind import CHAT
from nego.training.config import ConfigError, TrainConfig
from nego.training.policy_kind import kind_of_format, kinds, policy_kind
from nego.training.tiny_kind import TINY_KIND

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("model", "kind"), [("tiny", TINY_KIND), ("4.5b", CHAT), ("31b", CHAT), ("hf:/m", CHAT)])
def test_a_config_names_its_kind_by_its_model(model, kind):
    assert policy_kind(model) is kind and TrainConfig(model=model).kind is kind


def test_an_unknown_model_is_refused_naming_every_kind():
    with pytest.raises(ConfigError, match=r"not one of tiny, smollm2, 2\.3b, 4\.5b, 12b, 31b or hf:PATH"):
        TrainConfig(model="gpt-2").validate()


def test_the_defaults_of_the_auto_fields_come_from_the_kind():
    tiny, chat = TrainConfig(), TrainConfig(model="hf:/m")
    assert (tiny.learning_rate, tiny.sampling_temperature) == (TINY_KIND.default_lr, TINY_KIND.default_temperature)
    assert (chat.learning_rate, chat.sampling_temperature) == (CHAT.default_lr, CHAT.default_temperature)
    assert TrainConfig(lr=3e-5, temperature=0.5).learning_rate == 3e-5
    resolved = TINY_KIND.resolve(TrainConfig())
    assert (resolved.finetune, resolved.max_tokens) == ("full", TINY_KIND.learner_max_tokens)
    chat = CHAT.resolve(TrainConfig(model="hf:/m"))
    assert (chat.finetune, chat.max_tokens) == ("auto", 0)  # the preflight decides
    assert chat.sft_steps == 0 and chat.sft_batch > 0  # an instruction checkpoint gets no warm start unless asked


def test_the_kind_refuses_what_it_cannot_train():
    with pytest.raises(ConfigError, match="tiny model trains fully"):
        TrainConfig(finetune="lora").validate()
    with pytest.raises(ConfigError, match="league buyers are played by the tiny model only"):
        TrainConfig(model="hf:/m", train_buyers=["tft", "league:every=10"]).validate()


def test_a_registered_model_finds_its_kind_by_format_and_back():
    for kind in kinds():
        assert kind_of_format(kind.registry_format) is kind
        assert policy_kind(kind.config_model("/some/checkpoint")) is kind
    with pytest.raises(ValueError, match="format"):
        kind_of_format("onnx")


def test_no_module_outside_the_kinds_asks_which_kind_it_has():
    kind_modules = {"policy_kind.py", "tiny_kind.py", "chat_kind.py"}
    asks = re.compile(r"is_tiny|_compact\b|model\s*==\s*(TINY|\"tiny\")|format\s*==\s*\"compact\"")
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for folder in ("training", "cli", "evaluation")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p.name not in kind_modules
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if asks.search(line)
    ]
    assert not offenders, offenders
