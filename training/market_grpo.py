"""nego's ``GRPOTrainer``: TRL's, with the seeded per-epoch prompt order (:mod:`.prompt_order`) and, unless turned
off, the batch's log-probabilities read in length buckets (:mod:`.packing`) instead of one padded matrix.

Every log-probability TRL asks for goes through ``_get_per_token_logps_and_entropies``: the loss forward, the old
policy's (importance ratio) and the reference model's (KL), so all three read the same layout. Batches the buckets do
not cover (images, a mixture-of-experts load-balancing loss, rows without a prompt token) are read TRL's way.
Processes that shard one model (FSDP) first agree on how many buckets each reads (:func:`.packing.agreed`), since
each model call gathers the weights from all of them.
"""

from __future__ import annotations

from typing import Any

from .packing import agreed, plan_batch, read_buckets
from .prompt_order import EpochSeeded


def grpo_trainer_class() -> type:
    """The trainer class (TRL is imported here, when a trainer is built). Its ``pack`` keyword (default True) turns
    the length buckets on or off."""
    from trl import GRPOTrainer

    class MarketGRPOTrainer(GRPOTrainer):
        def __init__(self, *args: Any, pack: bool = True, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.pack = pack

        def _get_train_sampler(self, dataset: Any = None) -> Any:
            return EpochSeeded(super()._get_train_sampler(dataset), self.args.seed)

        def _get_per_token_logps_and_entropies(
            self,
            model: Any,
            input_ids: Any,
            attention_mask: Any,
            logits_to_keep: int,
            batch_size: int | None = None,
            compute_entropy: bool = False,
            compute_aux_loss: bool = False,
            **extra: Any,
        ) -> tuple[Any, Any, Any]:
            if self.pack and not compute_aux_loss and all(v is None for v in extra.values()):

                def forward(ids: Any, mask: Any, positions: Any, labels: Any) -> tuple[Any, Any]:
                    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=positions, labels=labels)
                    with self.accelerator.autocast():
                        out = model(**inputs, fused_lm_head=True)
                    return out.log_probs, (out.entropy if compute_entropy else None)

                plan = plan_batch(attention_mask, logits_to_keep, max_rows=batch_size or input_ids.size(0))
                if self.accelerator.num_processes > 1:
                    plan = agreed(plan, self._bucket_counts)
                if plan is not None:
                    logps, entropies = read_buckets(forward, input_ids, plan, logits_to_keep)
                    return logps, entropies, None
            return super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                **extra,
            )

        def _bucket_counts(self, mine: int) -> list[int]:
            """Every process's bucket count, handed to all of them."""
            import torch

            return self.accelerator.gather(torch.tensor([mine], device=self.accelerator.device)).tolist()

    return MarketGRPOTrainer
