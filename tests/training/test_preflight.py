"""Preflight for real models: published Gemma 4 shapes, episode lengths in the chat layout, memory and the plan."""

from __future__ import annotations

import asyncio

import pytest
from nego.agents.llm.backends.hf_engine import Generated
from nego.agents.registry import resolve
from nego.market.marketplace import Job, child_seeds, run_jobs
from nego.market.protocol import run_negotiation
from nego.scenarios.scenario import Role
from nego.training.chat_rollout import ChatNegotiator, ChatPolicy
from nego.training.config import DEFAULT_TRAIN_BUYERS, TrainConfig
from nego.training.episode_lengths import (
    EpisodeLengths,
    Spread,
    eos_id,
    measure_episode_lengths,
    render_episode,
    reply_text,
)
from nego.training.gemma4_shapes import FULL, SHAPES, build_config, layer_types
from nego.training.memory_model import GiB, model_facts
from nego.training.preflight import PreflightError, TrainPlan, episode_cap, plan, usable_bytes
from nego.training.rollout import split_scenarios
from nego.training.stand_in_tokenizer import gemma_style_tokenizer

MiB = 2**20
# total memory as nvidia-smi reports it for one GPU of each class
GPUS = {24: 24564 * MiB, 48: 46068 * MiB, 80: 81559 * MiB, 141: 143771 * MiB}
# Gemma-tokenizer-like lengths at 10 rounds (chat layout, rule sellers): median ~690, most over 512
LENGTHS = EpisodeLengths(
    64, 10, Spread(693, 1047, 1330, 1330), Spread(779, 925, 1015, 1015), Spread(7, 9, 10, 10), "recorded"
)


@pytest.fixture(scope="module")
def facts():
    return {alias: model_facts(build_config(alias)) for alias in SHAPES}


@pytest.fixture(scope="module")
def tok():
    return gemma_style_tokenizer()


def test_published_shapes_count_what_the_model_cards_say(facts):
    e4b, e2b = facts["4.5b"], facts["2.3b"]
    assert e4b.model_class == "Gemma4ForConditionalGeneration"
    assert abs(e4b.text / 1e9 - 7.46) < 0.01 and abs(e4b.total / 1e9 - 7.94) < 0.01  # "8B with embeddings"
    assert abs(e2b.text / 1e9 - 4.63) < 0.01 and abs(e2b.total / 1e9 - 5.10) < 0.01  # "5.1B with embeddings"
    assert facts["12b"].model_class == "Gemma4UnifiedForConditionalGeneration" and facts["12b"].towers < 0.1e9
    assert abs(facts["31b"].text / 1e9 - 30.70) < 0.01
    # the KV-shared tail keeps no caches: E4B's last 18 of 42 layers, E2B's last 20 of 35
    assert (len(e4b.cache_layers), len(e2b.cache_layers)) == (24, 15)


def test_attention_follows_the_published_five_to_one_pattern():
    types = build_config("4.5b").get_text_config().layer_types
    assert [i for i, t in enumerate(types) if t == FULL] == [5, 11, 17, 23, 29, 35, 41]
    e2b = build_config("2.3b").get_text_config().layer_types
    assert [i for i, t in enumerate(e2b) if t == FULL] == list(range(4, 35, 5))
    assert layer_types(12, 6)[0] != FULL and layer_types(12, 6)[5] == FULL
    cut = build_config("4.5b", layers=12).get_text_config()
    assert cut.num_hidden_layers == 12 and cut.num_kv_shared_layers == 5 and cut.layer_types[11] == FULL
    with pytest.raises(ValueError, match="multiple of its attention period 6"):
        build_config("4.5b", layers=10)


# (size, GPU GB) -> (chosen with no --finetune, --finetune full given, --finetune lora given); None = refused
TABLE = {
    ("2.3b", 24): ("lora", None, "lora"),
    ("2.3b", 48): ("lora", "full", "lora"),
    ("2.3b", 80): ("full", "full", "lora"),
    ("2.3b", 141): ("full", "full", "lora"),
    ("4.5b", 24): ("lora", None, "lora"),
    ("4.5b", 48): ("lora", None, "lora"),
    ("4.5b", 80): ("lora", "full", "lora"),
    ("4.5b", 141): ("full", "full", "lora"),
    ("12b", 24): (None, None, None),
    ("12b", 48): ("lora", None, "lora"),
    ("12b", 80): ("lora", None, "lora"),
    ("12b", 141): ("lora", "full", "lora"),
    ("31b", 24): (None, None, None),
    ("31b", 48): (None, None, None),
    ("31b", 80): ("lora", None, "lora"),
    ("31b", 141): ("lora", None, "lora"),
}


@pytest.mark.parametrize(("size", "gb"), sorted(TABLE))
def test_plan_table(facts, size, gb):
    requests = [(TrainConfig(model=size), ())]
    requests += [(TrainConfig(model=size, finetune=m), {"finetune"}) for m in ("full", "lora")]
    lora_fits = TABLE[size, gb][2] is not None
    for (cfg, given), want in zip(requests, TABLE[size, gb], strict=True):
        if want is None:
            with pytest.raises(PreflightError) as err:
                plan(cfg, GPUS[gb], facts=facts[size], lengths=LENGTHS, given=given)
            msg = str(err.value)
            assert ("use --finetune lora" in msg) == (cfg.finetune == "full" and bool(given) and lora_fits)
            assert ("larger GPU" in msg) == (not lora_fits)
            continue
        p = plan(cfg, GPUS[gb], facts=facts[size], lengths=LENGTHS, given=given)
        assert p.finetune == want
        assert p.micro_batch * p.grad_accum == p.sequences == 64 and 1 <= p.micro_batch <= 8
        assert p.memory.peak <= usable_bytes(GPUS[gb]) and p.time_budget_min == 0.0
        assert p.max_tokens == episode_cap(LENGTHS) and p.max_tokens >= LENGTHS.episode.p99


def test_refusals_name_the_flag_to_change(facts):
    e4b = facts["4.5b"]
    with pytest.raises(PreflightError, match=r"full fine-tuning needs at least \d+\.\d GiB.*use --finetune lora"):
        plan(TrainConfig(model="4.5b", finetune="full"), GPUS[48], facts=e4b, lengths=LENGTHS, given={"finetune"})
    with pytest.raises(PreflightError, match=r"below the measured 99th percentile.*--max-tokens to 1664.*--max-rounds"):
        plan(TrainConfig(model="4.5b", max_tokens=512), GPUS[80], facts=e4b, lengths=LENGTHS, given={"max_tokens"})
    with pytest.raises(PreflightError, match=r"needs a CUDA GPU.*--model hf:PATH"):
        plan(TrainConfig(model="4.5b"), None, facts=e4b, lengths=LENGTHS)
    with pytest.raises(PreflightError, match=r"weights alone need .*smaller --model \(2\.3b, 4\.5b, 12b\)"):
        plan(TrainConfig(model="31b", finetune="lora"), GPUS[48], facts=facts["31b"], lengths=LENGTHS)


def test_what_the_user_gives_is_kept(facts):
    cfg = TrainConfig(model="4.5b", max_tokens=2048, time_budget_min=30.0)
    p = plan(cfg, GPUS[80], facts=facts["4.5b"], lengths=LENGTHS, given={"max_tokens", "time_budget_min"})
    assert (p.max_tokens, p.time_budget_min) == (2048, 30.0) and "given" in p.max_tokens_why
    applied = p.apply(TrainConfig(model="4.5b"))
    assert (applied.max_tokens, applied.finetune, applied.time_budget_min) == (2048, "lora", 30.0)
    text = p.describe()
    assert "max_tokens 2048: given (--max-tokens)" in text and "finetune lora" in text and "30.0 min" in text


def test_the_micro_batch_layout_makes_one_trl_generation_batch_per_step(facts, tmp_path):
    from trl import GRPOConfig

    p: TrainPlan = plan(TrainConfig(model="4.5b"), GPUS[48], facts=facts["4.5b"], lengths=LENGTHS)
    assert p.micro_batch < p.sequences
    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, num_generations=8, report_to="none", **p.grpo_overrides()
    )
    # rollout_func then sees every group of the step at once, and one optimizer step covers them all
    assert args.generation_batch_size == p.sequences and args.steps_per_generation == p.grad_accum


def test_vllm_colocated_reserves_room_for_its_own_copy_of_the_weights(facts):
    e4b = facts["4.5b"]
    p = plan(TrainConfig(model="4.5b", use_vllm=True), GPUS[80], facts=e4b, lengths=LENGTHS)
    assert p.vllm_gpu_memory_utilization is not None
    assert p.vllm_gpu_memory_utilization * GPUS[80] >= 2 * e4b.total and p.memory.reserved > 0
    assert p.generation_rows_needed == 64 * 7  # dev evaluations (64 scenarios x 7 buyers) still use transformers


def test_rendered_episodes_match_what_the_chat_rollout_builds(tok):
    """Replay rule-seller negotiations through the chat rollout's own negotiator, answering with the rule seller's
    replies: the ids, masks and prompt must equal the rendering from the recorded result."""
    scenarios = split_scenarios("train", 6, 6)
    jobs = [Job(sc, "timedep:e=1", ("tft", "timedep:e=0.5")[i % 2], 100 + i) for i, sc in enumerate(scenarios)]
    for job, result in zip(jobs, run_jobs(resolve, jobs), strict=True):
        expected = render_episode(tok, job.scenario, result)
        replies = iter([reply_text(t.action) for t in result.turns if t.role is Role.SELLER])
        policy = ChatPolicy(None, tok, max_new=10_000, generator=_Scripted(tok, replies))
        seller = ChatNegotiator(policy, Role.SELLER, 0, None)
        buyer = resolve(job.buyer)(Role.BUYER, child_seeds(job.seed)[1])
        replay = asyncio.run(run_negotiation(job.scenario, seller, buyer, seed=job.seed))
        assert replay.outcome == result.outcome
        trace = seller.record(replay)
        assert list(trace.prompt_ids) == expected.prompt and list(trace.completion_ids) == expected.ids
        assert list(trace.mask) == expected.mask and sum(expected.mask) > 0


class _Scripted:
    """A stand-in for the policy's generator that answers each request with the next scripted reply."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.eos_id = tokenizer, replies, eos_id(tokenizer)

    async def generate(self, ids, max_new, temperature, seed):
        out = (*self.tokenizer.encode(next(self.replies), add_special_tokens=False), self.eos_id)
        return Generated(out, (0.0,) * len(out), True)

    async def aclose(self):
        pass


def test_measured_lengths_set_a_cap_the_old_default_was_under(tok):
    lengths = measure_episode_lengths(tok, n=32, max_rounds=10, buyers=DEFAULT_TRAIN_BUYERS)
    e = lengths.episode
    assert lengths.episodes == 32 and e.p50 <= e.p90 <= e.p99 <= e.max and lengths.prompt.p50 > 100
    assert 1 <= lengths.turns.max <= 10 * 3 and "tokenizer" in lengths.source
    assert e.p99 > 512  # at 10 rounds most episodes are longer than the old 512-token cap
    cap = episode_cap(lengths)
    assert cap >= e.p99 * 1.25 and cap % 64 == 0


def test_the_stand_in_tokenizer_has_gemma_turn_markers(tok):
    from nego.training.chat_rollout import user_suffix_ids

    ids = tok.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert ids == "<bos><start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n"
    suffix = tok.decode(user_suffix_ids(tok, "Rounds left: 2"))
    assert suffix == "\n<start_of_turn>user\nRounds left: 2<end_of_turn>\n<start_of_turn>model\n"
    assert tok.eos_token == "<end_of_turn>"


def test_memory_arithmetic_matches_the_stated_bytes_per_parameter(facts):
    from nego.training.memory_model import state_bytes

    e4b = facts["4.5b"]
    w, g, o = state_bytes(e4b, "full", 0)
    assert (w, g, o) == (2 * e4b.total, 2 * e4b.text, 4 * e4b.text)
    assert (w + g + o) / GiB > 55  # does not fit one 48 GB GPU before any activation
    w, g, o = state_bytes(e4b, "lora", 16)
    assert g == 4 * e4b.lora(16) and o == 8 * e4b.lora(16) and w == 2 * e4b.total + 4 * e4b.lora(16)


# SmolLM2-135M-Instruct's shape (its config.json); lengths as measured in its chat layout at 10 rounds
SMOLLM2_SHAPE = dict(
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3
)
SMOLLM2_LENGTHS = EpisodeLengths(
    64, 10, Spread(724, 1109, 1348, 1348), Spread(387, 485, 511, 511), Spread(7, 10, 10, 10), "recorded"
)


@pytest.fixture(scope="module")
def smollm2_facts():
    from transformers import LlamaConfig

    return model_facts(LlamaConfig(vocab_size=49152, tie_word_embeddings=True, **SMOLLM2_SHAPE))


def test_on_a_cpu_the_state_bytes_are_fp32(smollm2_facts):
    from nego.training.memory_model import state_bytes

    f = smollm2_facts
    assert abs(f.total / 1e6 - 134.5) < 0.1 and f.heads == 9
    assert state_bytes(f, "full", 0, on_cpu=True) == (4 * f.total, 4 * f.text, 8 * f.text)
    assert state_bytes(f, "lora", 8, on_cpu=True)[0] == 4 * f.total + 4 * f.lora(8)


def test_a_cpu_memory_budget_sizes_the_micro_batch_and_the_generation_rows(smollm2_facts):
    from nego.training.config import model_preset
    from nego.training.preflight import CPU_OVERHEAD

    cfg = model_preset("smollm2")
    assert cfg.memory_gb == 8
    plans = [
        plan(cfg, None, facts=smollm2_facts, lengths=SMOLLM2_LENGTHS, cpu_bytes=gb * GiB, cpu_source="test")
        for gb in (6, 8, 12, 16, 64)
    ]
    for p, gb in zip(plans, (6, 8, 12, 16, 64), strict=True):
        assert p.memory.peak <= gb * GiB - CPU_OVERHEAD and p.finetune == "full"
        assert p.micro_batch * p.grad_accum == p.sequences == 8
        assert p.apply(cfg).generation_rows == p.generation_rows
    assert [p.micro_batch for p in plans] == sorted(p.micro_batch for p in plans)
    assert [p.generation_rows for p in plans] == sorted(p.generation_rows for p in plans)
    assert plans[1].generation_rows < plans[-1].generation_rows == 56  # 8 dev scenarios x 7 dev buyers
    assert plans[-1].micro_batch == 8 and plans[1].micro_batch < 8
    text = plans[1].describe()
    assert "a CPU, memory budget 8.0 GiB (test" in text and "a dev evaluation plays that many negotiations" in text
    unchecked = plan(cfg, None, facts=smollm2_facts, lengths=SMOLLM2_LENGTHS)
    assert (unchecked.micro_batch, unchecked.generation_rows) == (8, 56)
    assert "memory not checked" in unchecked.describe()


def test_a_cpu_budget_too_small_is_refused_naming_memory_gb(smollm2_facts):
    cfg = TrainConfig(model="smollm2")
    with pytest.raises(PreflightError, match=r"does not fit this CPU's memory budget of 2\.0 GiB.*raise --memory-gb"):
        plan(cfg, None, facts=smollm2_facts, lengths=SMOLLM2_LENGTHS, cpu_bytes=2 * GiB, cpu_source="test")


def test_the_cpu_budget_is_memory_gb_else_a_share_of_the_available_ram(monkeypatch):
    import psutil
    from nego.training.preflight import CPU_AVAILABLE_SHARE, cpu_budget

    assert cpu_budget(TrainConfig(model="smollm2", memory_gb=6.5)) == (int(6.5 * GiB), "--memory-gb 6.5")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("Memory", (), {"available": 20 * GiB})())
    got, source = cpu_budget(TrainConfig(model="smollm2"))
    assert got == int(20 * GiB * CPU_AVAILABLE_SHARE) and "80% of the 20.0 GiB available" in source


def test_given_generation_rows_are_kept(smollm2_facts):
    cfg = TrainConfig(model="smollm2", generation_rows=5)
    assert "generation_rows" in cfg.given
    p = plan(cfg, None, facts=smollm2_facts, lengths=SMOLLM2_LENGTHS, given=cfg.given, cpu_bytes=64 * GiB)
    assert p.generation_rows == 5 and p.apply(cfg).generation_rows == 5


@pytest.mark.slow
def test_train_on_a_tiny_gemma4_at_the_defaults_runs_without_a_token_cap_error(tok, tmp_path, monkeypatch):
    """Every default but the step count and batch sizes: 10 rounds, an auto episode cap from the preflight, auto
    fine-tuning. The random model's generation config lists every id as an end of text, so each reply is one token
    (the engine stops at every end-of-text id): the negotiations run their full 10 rounds of invalid replies and
    retries, cheaply."""
    import torch
    from nego.training import grpo
    from nego.training.gemma4_shapes import tiny_config
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))
    # the two dev evaluations (before and after GRPO) would play each of the 7 dev buyers for 10 rounds of retries:
    # one buyer shows the same thing in a seventh of the time
    monkeypatch.setattr(grpo, "DEV_BUYERS", ("tft",))
    ids = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(len(tok), **ids))
    model.generation_config.eos_token_id = list(range(len(tok)))
    model.save_pretrained(tmp_path / "g4")
    tok.save_pretrained(tmp_path / "g4")
    cfg = TrainConfig(
        model=f"hf:{tmp_path / 'g4'}",
        name="g4",
        out=str(tmp_path / "run"),
        steps=1,
        group_size=2,
        scenarios_per_step=1,
        train_scenarios=1,
        dev_scenarios=1,
        eval_every=0,
        save_every=0,
        threads=1,
    )
    lines: list[str] = []
    result = grpo.train(cfg, echo=lines.append)
    assert result.steps == 1
    planned = next(line for line in lines if line.startswith("preflight:"))
    assert "hf:" in planned and any("max_tokens" in line and "measured p99" in line for line in lines)
