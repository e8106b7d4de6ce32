"""The price book and the one pricing function (`price_job`): list price, batch discount, compute cost.

List prices are per 1M input, per 1M cached input and per 1M output tokens, versioned by the date they
take effect, so an old batch is always billed at the price in force when it ran. Cached input is the part
of the prompt the engine served from its prefix cache; its price is the version's own
`cached_input_usd_per_mtok`, else the input price x the book's `cached_input_factor`. A completion window
earns a discount (fraction of list). Compute cost is measured, not modelled: the engine-busy seconds attributed to a
job x the node's GPUs x the price per GPU-hour. All money is Decimal and is rounded only in
`CostBlock.to_json()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from storage.settings import Settings

ANY_MODEL = "*"


_MILLION = Decimal(1_000_000)


_SECONDS_PER_HOUR = Decimal(3600)


_USD_PLACES = Decimal("0.000001")


@dataclass(frozen=True)
class PriceVersion:
    """A model's online list prices from `effective_from` (00:00 UTC) until the next version."""

    model: str
    effective_from: date
    input_usd_per_mtok: Decimal
    output_usd_per_mtok: Decimal
    cached_input_usd_per_mtok: Decimal | None = None  # None: input price x the book's cached_input_factor

    def __post_init__(self) -> None:
        cached = self.cached_input_usd_per_mtok
        if self.input_usd_per_mtok < 0 or self.output_usd_per_mtok < 0 or (cached is not None and cached < 0):
            raise ValueError(f"prices for {self.model!r} must not be negative")

    def list_usd(
        self,
        *,
        input_tokens: int,
        output_tokens: int,
        cached_input_tokens: int = 0,
        cached_input_factor: Decimal = Decimal(1),
    ) -> Decimal:
        """What these tokens cost at list (online) price, unrounded; `cached_input_tokens` are part of the input."""
        cached_price = self.cached_input_usd_per_mtok
        if cached_price is None:
            cached_price = self.input_usd_per_mtok * cached_input_factor
        tokens_usd = (
            (input_tokens - cached_input_tokens) * self.input_usd_per_mtok
            + cached_input_tokens * cached_price
            + output_tokens * self.output_usd_per_mtok
        )
        return tokens_usd / _MILLION


# Placeholder list prices, not anyone's real rate card: an online price for a small model, with output
# at 4x input as the large APIs charge. Operators replace them through the price-book setting.
_PLACEHOLDER_FROM = date(2025, 1, 1)


DEFAULT_PRICES: tuple[PriceVersion, ...] = (
    PriceVersion("backfill-demo", _PLACEHOLDER_FROM, Decimal("0.60"), Decimal("2.40")),
    PriceVersion(ANY_MODEL, _PLACEHOLDER_FROM, Decimal("0.60"), Decimal("2.40")),
)


def _to_date(at: datetime | date | float) -> date:
    """The UTC calendar date of a datetime (naive means UTC), a date, or epoch seconds."""
    if isinstance(at, datetime):
        return at.astimezone(UTC).date() if at.tzinfo else at.date()
    if isinstance(at, date):
        return at
    return datetime.fromtimestamp(at, tz=UTC).date()


@dataclass(frozen=True)
class PriceBook:
    """Versioned list prices, completion-window discounts, and the node's rental price."""

    versions: tuple[PriceVersion, ...] = DEFAULT_PRICES
    window_discounts: Mapping[str, Decimal] = field(default_factory=lambda: {"24h": Decimal("0.5")})
    gpu_count: int = 8
    usd_per_gpu_hour: Decimal = Decimal("3.99")
    cached_input_factor: Decimal = Decimal("0.5")  # cached-input price = input price x this, unless a version sets it

    def __post_init__(self) -> None:
        if not Decimal(0) <= self.cached_input_factor <= Decimal(1):
            raise ValueError(f"cached_input_factor must be in [0, 1], got {self.cached_input_factor}")
        if self.gpu_count < 1:
            raise ValueError(f"gpu_count must be positive, got {self.gpu_count}")
        if self.usd_per_gpu_hour < 0:
            raise ValueError(f"usd_per_gpu_hour must not be negative, got {self.usd_per_gpu_hour}")
        for window, discount in self.window_discounts.items():
            if not Decimal(0) <= discount < Decimal(1):
                raise ValueError(f"discount for {window!r} must be in [0, 1), got {discount}")

    @property
    def node_usd_per_hour(self) -> Decimal:
        """Rental price of the whole node: GPUs x price per GPU-hour."""
        return self.gpu_count * self.usd_per_gpu_hour

    def price_for(self, model: str, at: datetime | date | float) -> PriceVersion:
        """The latest version for `model` in force at `at`, else the latest `*` version."""
        day = _to_date(at)
        for name in (model, ANY_MODEL):
            effective = [v for v in self.versions if v.model == name and v.effective_from <= day]
            if effective:
                return max(effective, key=lambda v: v.effective_from)
        raise LookupError(f"no price for model {model!r} on {day.isoformat()} and no '*' fallback")

    def discount_for(self, window: str) -> Decimal:
        """The fraction of list price taken off for this completion window."""
        try:
            return self.window_discounts[window]
        except KeyError:
            raise LookupError(f"no discount configured for completion window {window!r}") from None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PriceBook:
        """Build from settings-style JSON; absent keys keep the defaults and a '*' price is always kept.

        Shape: {"prices": [{"model", "effective_from": "YYYY-MM-DD", "input_usd_per_mtok",
        "output_usd_per_mtok", "cached_input_usd_per_mtok" (optional)}], "completion_windows": {"24h": "0.5"},
        "gpu_count": 8, "usd_per_gpu_hour": "3.99", "cached_input_factor": "0.5"}. Numbers may be strings or
        numbers; they go through str() into Decimal so 0.1 stays 0.1.
        """
        defaults = cls()
        versions = defaults.versions
        if "prices" in data:
            versions = tuple(_version_from_dict(item) for item in data["prices"])
            if not any(v.model == ANY_MODEL for v in versions):
                versions += tuple(v for v in DEFAULT_PRICES if v.model == ANY_MODEL)
        windows = data.get("completion_windows")
        return cls(
            versions=versions,
            window_discounts=(
                {w: to_decimal(d) for w, d in windows.items()} if windows else dict(defaults.window_discounts)
            ),
            gpu_count=int(data.get("gpu_count", defaults.gpu_count)),
            usd_per_gpu_hour=to_decimal(data.get("usd_per_gpu_hour", defaults.usd_per_gpu_hour)),
            cached_input_factor=to_decimal(data.get("cached_input_factor", defaults.cached_input_factor)),
        )

    def to_dict(self) -> dict[str, Any]:
        """The inverse of `from_dict`, with Decimals as strings."""
        return {
            "prices": [
                {
                    "model": v.model,
                    "effective_from": v.effective_from.isoformat(),
                    "input_usd_per_mtok": str(v.input_usd_per_mtok),
                    "output_usd_per_mtok": str(v.output_usd_per_mtok),
                    **(
                        {"cached_input_usd_per_mtok": str(v.cached_input_usd_per_mtok)}
                        if v.cached_input_usd_per_mtok is not None
                        else {}
                    ),
                }
                for v in self.versions
            ],
            "completion_windows": {w: str(d) for w, d in self.window_discounts.items()},
            "gpu_count": self.gpu_count,
            "usd_per_gpu_hour": str(self.usd_per_gpu_hour),
            "cached_input_factor": str(self.cached_input_factor),
        }


def to_decimal(value: Any) -> Decimal:
    """Decimal from a string, int, float or Decimal; floats go through str() to keep what was written."""
    if isinstance(value, Decimal):
        return value
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"expected a number, got {value!r}") from None
    if not number.is_finite():
        raise ValueError(f"expected a finite number, got {value!r}")
    return number


def _version_from_dict(item: Mapping[str, Any]) -> PriceVersion:
    cached = item.get("cached_input_usd_per_mtok")
    try:
        return PriceVersion(
            model=str(item["model"]),
            effective_from=date.fromisoformat(str(item["effective_from"])),
            input_usd_per_mtok=to_decimal(item["input_usd_per_mtok"]),
            output_usd_per_mtok=to_decimal(item["output_usd_per_mtok"]),
            cached_input_usd_per_mtok=None if cached is None else to_decimal(cached),
        )
    except KeyError as missing:
        raise ValueError(f"price entry {dict(item)!r} lacks {missing}") from None


def usd_text(value: Decimal) -> str:
    """Dollars as the API shows them: a string with six decimal places, rounded half up."""
    return str(value.quantize(_USD_PLACES, ROUND_HALF_UP))


@dataclass(frozen=True)
class CostBlock:
    """What a job was billed, what it would have cost online, and what it cost to compute."""

    input_tokens: int
    output_tokens: int
    list_usd: Decimal
    discount_pct: Decimal
    discount_usd: Decimal
    billed_usd: Decimal
    gpu_seconds: Decimal
    compute_usd: Decimal
    margin_usd: Decimal
    mean_batch_size: Decimal | None
    cached_input_tokens: int = 0  # of input_tokens, served from the prefix cache (priced at the cached rate)
    cached_input_usd_per_mtok: Decimal | None = None

    def to_json(self) -> dict[str, Any]:
        """Decimal strings, each rounded once here: USD to 6 places, GPU-seconds to 3."""
        cached_price = self.cached_input_usd_per_mtok
        return {
            "input_tokens": self.input_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cached_input_usd_per_mtok": None if cached_price is None else usd_text(cached_price),
            "output_tokens": self.output_tokens,
            "list_usd": usd_text(self.list_usd),
            "discount_pct": str(self.discount_pct.quantize(Decimal("0.01"), ROUND_HALF_UP)),
            "discount_usd": usd_text(self.discount_usd),
            "billed_usd": usd_text(self.billed_usd),
            "gpu_seconds": str(self.gpu_seconds.quantize(Decimal("0.001"), ROUND_HALF_UP)),
            "compute_usd": usd_text(self.compute_usd),
            "margin_usd": usd_text(self.margin_usd),
            "mean_batch_size": (
                None
                if self.mean_batch_size is None
                else str(self.mean_batch_size.quantize(Decimal("0.01"), ROUND_HALF_UP))
            ),
        }


def cost_block(
    *,
    input_tokens: int,
    output_tokens: int,
    busy_seconds: Decimal | float,
    gpu_count: int,
    usd_per_gpu_hour: Decimal,
    discount: Decimal,
    price: PriceVersion,
    mean_batch_size: Decimal | float | None = None,
    cached_input_tokens: int = 0,
    cached_input_factor: Decimal = Decimal("0.5"),
) -> CostBlock:
    """Price measured tokens and busy time: billed = list - discount, margin = billed - compute.

    `cached_input_tokens` (part of `input_tokens`) are priced at the cached-input rate."""
    if input_tokens < 0 or output_tokens < 0 or not 0 <= cached_input_tokens <= input_tokens:
        raise ValueError("token counts must not be negative, and cached input is part of the input")
    list_usd = price.list_usd(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=cached_input_tokens,
        cached_input_factor=cached_input_factor,
    )
    cached_price = price.cached_input_usd_per_mtok
    if cached_price is None:
        cached_price = price.input_usd_per_mtok * cached_input_factor
    discount_usd = list_usd * discount
    billed_usd = list_usd - discount_usd
    gpu_seconds = to_decimal(busy_seconds) * gpu_count
    compute_usd = gpu_cost(gpu_seconds, usd_per_gpu_hour)
    return CostBlock(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        list_usd=list_usd,
        discount_pct=discount * 100,
        discount_usd=discount_usd,
        billed_usd=billed_usd,
        gpu_seconds=gpu_seconds,
        compute_usd=compute_usd,
        margin_usd=billed_usd - compute_usd,
        mean_batch_size=None if mean_batch_size is None else to_decimal(mean_batch_size),
        cached_input_tokens=cached_input_tokens,
        cached_input_usd_per_mtok=cached_price,
    )


def token_weighted_mean_batch_size(step_batch_sizes: Iterable[int]) -> Decimal | None:
    """Mean running batch as seen by a token: sum(B^2) / sum(B) over decode steps (None if no tokens).

    A step at batch B emits B tokens, so weighting each step by its tokens is what the cost per token
    follows. Equal-interval samples of the running batch give the same estimate while TPOT is steady.
    """
    sizes = [b for b in step_batch_sizes if b > 0]
    tokens = sum(sizes)
    return Decimal(sum(b * b for b in sizes)) / tokens if tokens else None


def price_book(settings: Settings) -> PriceBook:
    """The price book the settings describe: list prices, window discounts and the node's rent."""
    return PriceBook.from_dict(
        {
            "cached_input_factor": settings.cached_input_price_factor,  # a price book's own factor wins
            **settings.price_book,
            "completion_windows": settings.completion_windows,
            "gpu_count": settings.gpu_count,
            "usd_per_gpu_hour": settings.gpu_hour_usd,
        }
    )


def compute_usd(busy_seconds: Decimal, book: PriceBook) -> Decimal:
    """What `busy_seconds` of the whole node cost: seconds x GPUs x price per GPU-hour / 3600."""
    return gpu_cost(busy_seconds * book.gpu_count, book.usd_per_gpu_hour)


def gpu_cost(gpu_seconds: Decimal, usd_per_gpu_hour: Decimal) -> Decimal:
    """The one compute-cost formula: GPU-seconds x price per GPU-hour / 3600."""
    return gpu_seconds * usd_per_gpu_hour / _SECONDS_PER_HOUR


def price_job(
    book: PriceBook,
    *,
    model: str | None,
    created_at: datetime | date | float,
    completion_window: str,
    input_tokens: int,
    output_tokens: int,
    busy_seconds: Decimal,
    mean_batch_size: Decimal | None = None,
    cached_input_tokens: int = 0,
) -> CostBlock:
    """A cost block at the list price of `created_at` and the window's discount (0 if no longer offered).

    `cached_input_tokens` (part of `input_tokens`) are billed at the book's cached-input price."""
    return cost_block(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        busy_seconds=busy_seconds,
        gpu_count=book.gpu_count,
        usd_per_gpu_hour=book.usd_per_gpu_hour,
        discount=book.window_discounts.get(completion_window, Decimal(0)),
        price=book.price_for(model or ANY_MODEL, created_at),
        mean_batch_size=mean_batch_size,
        cached_input_tokens=cached_input_tokens,
        cached_input_factor=book.cached_input_factor,
    )
