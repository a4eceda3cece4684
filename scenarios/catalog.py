"""Product categories for the scenario generator: issues with realistic units and ranges, and the story text.

Each numeric issue is given as a range of plausible centres, a relative spread around the centre and a range of
grid sizes; the generator draws concrete bounds from these. ``seller_up`` says whether the seller prefers higher
values (the buyer then prefers lower ones, unless the issue is ``alignable`` and the generator makes it a shared
interest). Categorical issues give each side's typical value of every option; the generator perturbs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .issues import IssueKind


@dataclass(frozen=True, slots=True)
class NumericSpec:
    """A numeric issue template: bounds are drawn around a centre in ``centre`` with +/- ``spread`` (relative)."""

    name: str
    kind: IssueKind
    unit: str
    description: str
    centre: tuple[float, float]
    spread: float
    points: tuple[int, int]
    seller_up: bool
    alignable: bool = False
    importance: tuple[float, float] = (1.0, 1.0)
    """Typical (seller, buyer) weight before normalisation."""
    step: float | None = None
    """A fixed grid step; by default a round step is chosen from the drawn range."""


@dataclass(frozen=True, slots=True)
class CategoricalSpec:
    """A categorical issue template with each side's typical value of every option."""

    name: str
    unit: str
    description: str
    options: tuple[str, ...]
    seller_values: tuple[float, ...]
    buyer_values: tuple[float, ...]
    importance: tuple[float, float] = (1.0, 1.0)


IssueSpec = NumericSpec | CategoricalSpec


@dataclass(frozen=True, slots=True)
class Category:
    """A product family: who sells what to whom, and the issues a deal of this kind settles."""

    name: str
    segment: str
    product: str
    seller_party: tuple[str, ...]
    buyer_party: tuple[str, ...]
    context: str
    issues: tuple[IssueSpec, ...]
    required: int
    """How many of the leading issues every scenario of this category has (the rest are drawn)."""

    def __post_init__(self) -> None:
        if not 3 <= self.required <= len(self.issues) <= 6:
            raise ValueError(f"category {self.name!r} needs 3..6 issues with at least 3 required")


INT, FLT = IssueKind.INT, IssueKind.FLOAT


def _price(unit: str, centre: tuple[float, float], what: str, spread: float = 0.2) -> NumericSpec:
    return NumericSpec("price", INT, unit, what, centre, spread, (11, 31), True, importance=(3.0, 3.0))


# fmt: off
CATEGORIES: tuple[Category, ...] = (
    Category(
        "laptops", "B2B", "{qty} business laptops",
        ("a regional IT reseller", "a hardware distributor"), ("a mid-sized accounting firm", "a software agency"),
        "{buyer} is replacing its staff laptops and has asked {seller} for a bulk quote.",
        (
            _price("USD per unit", (900, 1600), "price per laptop"),
            NumericSpec("delivery_days", INT, "days", "days from order to delivery", (20, 30), 0.6, (5, 9), True,
                        importance=(1.0, 1.5)),
            NumericSpec("warranty_months", INT, "months", "on-site warranty", (24, 24), 0.5, (5, 5), False,
                        importance=(1.5, 1.5), step=6),
            CategoricalSpec("payment_terms", "", "when the invoice is due", ("upfront", "net30", "net60"),
                            (1.0, 0.6, 0.1), (0.0, 0.6, 1.0)),
            CategoricalSpec("setup", "", "device imaging and enrolment", ("none", "basic", "full"), (1.0, 0.7, 0.2),
                            (0.0, 0.7, 1.0), importance=(0.7, 1.0)),
        ),
        3,
    ),
    Category(
        "freight", "B2B", "a {months}-month road freight contract",
        ("a trucking company", "a logistics provider"), ("a furniture manufacturer", "a beverage wholesaler"),
        "{buyer} needs weekly full-truckload shipments between its plant and two depots; {seller} bids for it.",
        (
            NumericSpec("rate_per_km", FLT, "USD/km", "rate per loaded kilometre", (1.6, 2.6), 0.2, (11, 21), True,
                        importance=(3.0, 3.0)),
            NumericSpec("weekly_loads", INT, "loads/week", "guaranteed loads per week", (12, 12), 0.5, (7, 7), True,
                        alignable=True, importance=(1.5, 1.0)),
            NumericSpec("contract_months", INT, "months", "length of the contract", (18, 18), 0.67, (6, 6), True,
                        alignable=True, step=6),
            CategoricalSpec("fuel_surcharge", "", "who carries fuel price risk", ("fixed", "indexed", "shared"),
                            (0.0, 1.0, 0.6), (1.0, 0.0, 0.5)),
            NumericSpec("late_penalty_pct", INT, "%", "rebate per late delivery", (5, 5), 1.0, (6, 6), False),
        ),
        3,
    ),
    Category(
        "saas", "B2B", "a {seats}-seat annual licence for a project-management SaaS",
        ("a SaaS vendor",), ("a consulting firm", "a hospital group", "a university department"),
        "{buyer} is choosing a collaboration tool for its teams; {seller}'s sales team is closing the deal.",
        (
            _price("USD per seat per year", (90, 240), "annual price per seat"),
            NumericSpec("term_years", INT, "years", "length of the commitment", (2, 2), 0.5, (3, 3), True,
                        alignable=True, importance=(1.5, 1.0)),
            CategoricalSpec("support", "", "support tier", ("standard", "priority", "dedicated"), (1.0, 0.6, 0.0),
                            (0.0, 0.6, 1.0)),
            NumericSpec("onboarding_hours", INT, "hours", "included onboarding and training", (20, 20), 1.0, (5, 5),
                        False, importance=(0.7, 1.0)),
            NumericSpec("sla_uptime", FLT, "%", "guaranteed monthly uptime", (99.7, 99.7), 0.0025, (5, 5), False,
                        importance=(0.8, 1.0), step=0.1),
        ),
        3,
    ),
    Category(
        "catering", "B2C", "catering for a {guests}-guest private celebration",
        ("a family-run caterer", "an events caterer"), ("a couple planning an anniversary", "a family"),
        "{buyer} is organising a party at home and has asked {seller} for a quote.",
        (
            _price("USD per guest", (35, 90), "price per guest"),
            CategoricalSpec("menu", "", "menu style", ("buffet", "family_style", "plated"), (1.0, 0.7, 0.0),
                            (0.2, 0.6, 1.0), importance=(1.0, 1.5)),
            NumericSpec("staff", INT, "people", "serving staff on the day", (4, 4), 0.5, (5, 5), False),
            NumericSpec("deposit_pct", INT, "%", "deposit paid at booking", (30, 30), 0.67, (6, 6), True,
                        importance=(1.0, 0.7)),
            CategoricalSpec("drinks", "", "drinks package", ("none", "soft", "full_bar"), (0.3, 0.6, 1.0),
                            (0.8, 1.0, 0.3), importance=(0.7, 0.7)),
        ),
        3,
    ),
    Category(
        "used_car", "B2C", "a {age}-year-old used {model}",
        ("a private seller", "a small used-car dealer"), ("a first-time car buyer", "a commuter"),
        "{buyer} is buying a car listed by {seller}; both are meeting to agree the terms.",
        (
            _price("USD", (6000, 18000), "sale price", spread=0.15),
            CategoricalSpec("warranty", "", "warranty on the car", ("as_is", "3_months", "12_months"), (1.0, 0.5, 0.0),
                            (0.0, 0.6, 1.0)),
            NumericSpec("handover_days", INT, "days", "days until the car is handed over", (10, 10), 1.0, (8, 8),
                        False, alignable=True, importance=(0.6, 0.8)),
            CategoricalSpec("tyres", "", "tyre set included", ("current", "new_summer", "summer_and_winter"),
                            (1.0, 0.5, 0.0), (0.0, 0.6, 1.0), importance=(0.5, 0.8)),
        ),
        3,
    ),
    Category(
        "office_lease", "B2B", "a {area} m2 office floor lease",
        ("a commercial landlord", "a property fund"), ("a growing fintech start-up", "an architecture studio"),
        "{buyer} is moving into a larger office and negotiates a lease with {seller}.",
        (
            _price("USD per m2 per month", (20, 55), "monthly rent per square metre"),
            NumericSpec("term_years", INT, "years", "lease length", (5, 5), 0.8, (9, 9), True, alignable=True,
                        importance=(2.0, 1.0)),
            NumericSpec("rent_free_months", INT, "months", "rent-free months at the start", (3, 3), 1.0, (7, 7), False),
            NumericSpec("fitout_allowance", INT, "USD per m2", "landlord's fit-out contribution", (150, 150), 1.0,
                        (7, 7), False),
            CategoricalSpec("break_clause", "", "tenant's early exit right", ("none", "year_3", "yearly"),
                            (1.0, 0.5, 0.0), (0.0, 0.6, 1.0)),
        ),
        3,
    ),
    Category(
        "gpu_cloud", "B2B", "a reservation of {gpus} cloud GPUs",
        ("a GPU cloud provider",), ("an AI start-up", "a biotech research lab"),
        "{buyer} needs reserved accelerator capacity for model training and asks {seller} for a commitment price.",
        (
            NumericSpec("price", FLT, "USD per GPU-hour", "reserved price per GPU-hour", (2.0, 3.5), 0.3, (16, 31),
                        True, importance=(3.0, 3.0)),
            NumericSpec("commitment_months", INT, "months", "committed term", (12, 12), 0.75, (7, 7), True,
                        alignable=True, importance=(2.0, 1.0), step=3),
            NumericSpec("prepay_pct", INT, "%", "share of the contract paid upfront", (50, 50), 1.0, (5, 5), True),
            CategoricalSpec("interconnect", "", "network between GPUs", ("ethernet", "infiniband"), (1.0, 0.4),
                            (0.3, 1.0), importance=(0.8, 1.5)),
            NumericSpec("start_weeks", INT, "weeks", "weeks until capacity is available", (4, 4), 1.0, (5, 5), True,
                        importance=(0.8, 1.2)),
        ),
        3,
    ),
    Category(
        "raw_materials", "B2B", "{tonnes} tonnes of {material}",
        ("a mining company", "a metals trader"), ("a car-parts foundry", "a cable manufacturer"),
        "{buyer} secures its supply of {material} for next quarter from {seller}.",
        (
            _price("USD per tonne", (600, 2400), "price per tonne", spread=0.12),
            NumericSpec("volume_tonnes", INT, "tonnes", "committed volume", (500, 500), 0.8, (10, 10), True,
                        alignable=True, importance=(1.5, 1.0)),
            CategoricalSpec("incoterm", "", "who pays shipping and bears risk", ("EXW", "FOB", "CIF", "DDP"),
                            (1.0, 0.75, 0.4, 0.0), (0.0, 0.4, 0.75, 1.0)),
            NumericSpec("payment_days", INT, "days", "days to pay the invoice", (45, 45), 1.0, (7, 7), False, step=15),
            NumericSpec("purity_pct", FLT, "%", "minimum guaranteed purity", (99.0, 99.0), 0.008, (5, 5), False,
                        importance=(0.8, 1.2), step=0.2),
        ),
        3,
    ),
    Category(
        "consulting", "B2B", "a {weeks}-week strategy consulting engagement",
        ("a boutique consultancy",), ("a regional retail chain", "a logistics company"),
        "{buyer} hires {seller} to review its pricing strategy.",
        (
            NumericSpec("day_rate", INT, "USD per day", "blended consultant day rate", (1200, 2400), 0.2, (11, 21),
                        True, importance=(3.0, 3.0)),
            NumericSpec("team_size", INT, "consultants", "consultants on the team", (4, 4), 0.5, (5, 5), True,
                        alignable=True),
            CategoricalSpec("fee_model", "", "how fees are set", ("time_and_materials", "fixed", "success_fee"),
                            (1.0, 0.5, 0.2), (0.1, 1.0, 0.6)),
            NumericSpec("payment_days", INT, "days", "days to pay each invoice", (45, 45), 1.0, (7, 7), False, step=15),
            NumericSpec("revisions", INT, "rounds", "rounds of revisions included", (3, 3), 1.0, (4, 4), False,
                        importance=(0.6, 0.8)),
        ),
        3,
    ),
    Category(
        "wedding_venue", "B2C", "a wedding venue for {guests} guests",
        ("a country house venue", "a lakeside hotel"), ("an engaged couple",),
        "{buyer} are booking {seller} for their wedding day.",
        (
            _price("USD", (8000, 25000), "venue hire fee", spread=0.15),
            CategoricalSpec("day", "", "day of the week", ("saturday", "friday", "sunday", "weekday"),
                            (1.0, 0.5, 0.4, 0.0), (1.0, 0.8, 0.6, 0.0), importance=(1.0, 1.5)),
            NumericSpec("venue_hours", INT, "hours", "hours of exclusive use on the day", (8, 8), 0.25, (5, 5), False,
                        importance=(0.7, 1.0)),
            NumericSpec("deposit_pct", INT, "%", "deposit paid at booking", (30, 30), 0.67, (6, 6), True),
            CategoricalSpec("cancellation", "", "cancellation policy", ("strict", "moderate", "flexible"),
                            (1.0, 0.6, 0.0), (0.0, 0.5, 1.0), importance=(0.7, 1.0)),
        ),
        3,
    ),
    Category(
        "solar_install", "B2C", "a {kw} kW rooftop solar installation",
        ("a solar installer",), ("a homeowner",),
        "{buyer} wants solar panels on the roof and compares quotes; this one is from {seller}.",
        (
            _price("USD", (9000, 22000), "installed price", spread=0.15),
            CategoricalSpec("panels", "", "panel brand tier", ("standard", "premium"), (1.0, 0.5), (0.3, 1.0)),
            NumericSpec("install_weeks", INT, "weeks", "weeks until installation", (6, 6), 0.67, (5, 5), True,
                        importance=(0.8, 1.0)),
            NumericSpec("workmanship_years", INT, "years", "workmanship warranty", (10, 10), 0.5, (3, 3), False),
            CategoricalSpec("battery", "", "home battery", ("none", "5kWh", "10kWh"), (0.2, 1.0, 0.6), (0.3, 1.0, 0.8),
                            importance=(0.8, 1.0)),
        ),
        3,
    ),
    Category(
        "ad_campaign", "B2B", "a {weeks}-week online ad campaign",
        ("a publisher's ad sales team", "a media network"), ("a consumer electronics brand", "a travel agency"),
        "{buyer} books a display and video campaign with {seller}.",
        (
            NumericSpec("cpm", FLT, "USD per 1000 impressions", "price per thousand impressions", (6.0, 18.0), 0.25,
                        (11, 25), True, importance=(3.0, 3.0)),
            NumericSpec("impressions_m", INT, "million", "guaranteed impressions", (10, 10), 0.8, (10, 10), True,
                        alignable=True),
            CategoricalSpec("targeting", "", "audience targeting", ("broad", "contextual", "first_party"),
                            (1.0, 0.7, 0.3), (0.2, 0.6, 1.0)),
            NumericSpec("makegood_pct", INT, "%", "free extra delivery if targets are missed", (10, 10), 1.0, (5, 5),
                        False, importance=(0.7, 1.0)),
            CategoricalSpec("reporting", "", "reporting cadence", ("monthly", "weekly", "daily"), (1.0, 0.7, 0.3),
                            (0.3, 0.8, 1.0), importance=(0.4, 0.6)),
        ),
        3,
    ),
    Category(
        "apartment_rental", "B2C", "a {rooms}-room apartment",
        ("a private landlord", "a letting agency"), ("a young couple", "a graduate student"),
        "{buyer} wants to rent an apartment from {seller}.",
        (
            _price("USD per month", (900, 2600), "monthly rent", spread=0.12),
            NumericSpec("lease_months", INT, "months", "lease length", (12, 12), 0.5, (3, 3), True, alignable=True,
                        step=6),
            NumericSpec("deposit_months", INT, "months of rent", "security deposit", (2, 2), 0.5, (3, 3), True),
            CategoricalSpec("furnished", "", "furnishing", ("unfurnished", "partly", "fully"), (1.0, 0.6, 0.2),
                            (0.3, 0.8, 1.0), importance=(0.7, 1.0)),
            CategoricalSpec("pets", "", "pets allowed", ("no", "yes"), (1.0, 0.3), (0.5, 1.0), importance=(0.5, 0.8)),
        ),
        3,
    ),
    Category(
        "home_renovation", "B2C", "a {rooms}-room home renovation",
        ("a building contractor",), ("a homeowner", "a retired couple"),
        "{buyer} is renovating and negotiates the contract with {seller}.",
        (
            _price("USD", (15000, 60000), "fixed contract price", spread=0.15),
            NumericSpec("duration_weeks", INT, "weeks", "time to completion", (10, 10), 0.6, (7, 7), True,
                        importance=(1.0, 1.5)),
            NumericSpec("delay_penalty", INT, "USD per week", "penalty per week of delay", (500, 500), 1.0, (6, 6),
                        False),
            CategoricalSpec("materials", "", "finishing materials", ("basic", "mid_range", "premium"), (0.7, 1.0, 0.6),
                            (0.2, 0.7, 1.0)),
            NumericSpec("retention_pct", INT, "%", "payment held back until snagging is done", (5, 5), 1.0, (5, 5),
                        False, importance=(0.6, 0.8)),
        ),
        3,
    ),
)
# fmt: on

FILLERS: dict[str, tuple[tuple[int, int, int], ...] | tuple[str, ...]] = {
    "qty": ((20, 200, 10),),
    "months": ((6, 36, 6),),
    "seats": ((25, 500, 25),),
    "guests": ((40, 180, 10),),
    "age": ((2, 12, 1),),
    "model": ("compact hatchback", "family estate", "mid-size SUV", "city car"),
    "area": ((300, 2000, 100),),
    "gpus": ((16, 256, 16),),
    "tonnes": ((200, 5000, 100),),
    "material": ("copper cathode", "aluminium ingot", "nickel briquettes", "zinc"),
    "weeks": ((4, 16, 2),),
    "kw": ((4, 12, 1),),
    "rooms": ((2, 5, 1),),
}
"""Values for the ``{placeholders}`` of product and context text: integer ranges (low, high, step) or choices."""


def category(name: str) -> Category:
    """The category called ``name``; raise KeyError listing the known ones."""
    for c in CATEGORIES:
        if c.name == name:
            return c
    raise KeyError(f"unknown category {name!r}; known: {', '.join(category_names())}")


def category_names() -> tuple[str, ...]:
    return tuple(c.name for c in CATEGORIES)
