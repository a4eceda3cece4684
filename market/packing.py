"""Negotiation results as plain tuples, to cross a process boundary cheaply.

Pickle stores a frozen slotted dataclass field by field through Python-level state functions, so a result of a
dozen turns costs about as much to pickle and unpickle as the negotiation cost to play. Tuples of strings and
numbers go through pickle's C paths; :func:`unpack_result` rebuilds exactly the result :func:`pack_result` was given.

An offer is packed as its values and its compact JSON text (the transcripts' encoding, which the playing side keeps
per offer object: a rule negotiator's offers come from a table shared by its negotiations, so each is encoded once per
process), and unpacked as an :class:`Offer` that already holds that text: the receiving side writes it without
encoding the offer again. An offer object that appears in several turns of a result (a rule negotiator repeating its
offer, an agreement on the standing offer) is packed once, which pickle stores once, and unpacked as one offer.
"""

from __future__ import annotations

from typing import Any

from .types import KIND_OF, REASON_OF, ROLE_OF, Action, NegotiationResult, Offer, Outcome, Turn, Usage

PackedResult = tuple[Any, ...]
"""What :func:`pack_result` makes: nested tuples of str, int, float, bool, None, and per offer its values (a dict)
with its JSON text."""

PackedOffer = tuple[dict[str, Any], str]


def _pack_usage(u: Usage | None) -> tuple[Any, ...] | None:
    return None if u is None else (u.prompt_tokens, u.completion_tokens, u.latency_s, u.cost_usd, u.calls)


def _pack_offer(offer: Offer | None, packed: dict[int, PackedOffer]) -> PackedOffer | None:
    """``offer``'s values and JSON text; the same tuple for the same offer object within one result (``packed``
    remembers them)."""
    if offer is None:
        return None
    pair = packed.get(id(offer))
    if pair is None:
        # the offer's own dict, not a copy: pickling copies it, and an offer is never changed
        pair = packed[id(offer)] = (offer.as_mapping(), offer.to_json())  # type: ignore[assignment]
    return pair


def _pack_turn(t: Turn, packed: dict[int, PackedOffer]) -> tuple[Any, ...]:
    a = t.action
    action = (a.kind.value, _pack_offer(a.offer, packed), a.message, a.raw, a.error, _pack_usage(a.usage))
    return (t.index, t.round, t.role.value, t.attempt, action, t.valid, t.feedback, t.utility_seller, t.utility_buyer)


def pack_result(r: NegotiationResult) -> PackedResult:
    """``r`` as nested tuples of plain values (see :func:`unpack_result`)."""
    o = r.outcome
    packed: dict[int, PackedOffer] = {}  # the result keeps every offer alive, so no id is reused meanwhile
    outcome = (
        o.end_reason.value,
        _pack_offer(o.agreement, packed),
        o.seller_utility,
        o.buyer_utility,
        o.rounds,
        o.turns,
        None if o.ended_by is None else o.ended_by.value,
        o.invalid_seller,
        o.invalid_buyer,
        o.forfeits_seller,
        o.forfeits_buyer,
        o.error,
    )
    turns = tuple(_pack_turn(t, packed) for t in r.turns)
    return (r.scenario_id, r.seed, outcome, turns, _pack_usage(r.usage_seller), _pack_usage(r.usage_buyer))


def _usage(packed: tuple[Any, ...] | None) -> Usage | None:
    return None if packed is None else Usage(*packed)


def _offer(pair: PackedOffer | None, offers: dict[int, Offer]) -> Offer | None:
    """The offer of a packed (values, JSON text) pair; one offer per pair object within one result (``offers``
    remembers them)."""
    if pair is None:
        return None
    offer = offers.get(id(pair))
    if offer is None:
        offer = offers[id(pair)] = Offer.encoded(*pair)
    return offer


def _turn(packed: tuple[Any, ...], offers: dict[int, Offer]) -> Turn:
    index, round_, role, attempt, (kind, offer, message, raw, error, usage), valid, feedback, us, ub = packed
    action = Action(KIND_OF[kind], _offer(offer, offers), message, raw, error, _usage(usage))
    return Turn(index, round_, ROLE_OF[role], attempt, action, valid, feedback, us, ub)


def unpack_result(packed: PackedResult) -> NegotiationResult:
    """The :class:`NegotiationResult` that :func:`pack_result` packed."""
    scenario_id, seed, o, turns, usage_seller, usage_buyer = packed
    reason, agreement, us, ub, rounds, n_turns, ended_by, inv_s, inv_b, forf_s, forf_b, error = o
    offers: dict[int, Offer] = {}  # ``packed`` keeps every dict alive, so no id is reused meanwhile
    outcome = Outcome(
        REASON_OF[reason],
        _offer(agreement, offers),
        us,
        ub,
        rounds,
        n_turns,
        None if ended_by is None else ROLE_OF[ended_by],
        inv_s,
        inv_b,
        forf_s,
        forf_b,
        error,
    )
    return NegotiationResult(
        scenario_id,
        seed,
        outcome,
        tuple(_turn(t, offers) for t in turns),
        _usage(usage_seller),  # type: ignore[arg-type]
        _usage(usage_buyer),  # type: ignore[arg-type]
    )
