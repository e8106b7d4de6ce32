"""Strict parsing of the numbers a client sends: money, batch priorities and result cursors.

One rule each, the same on both protocols and in the CLI, and one error for a value that breaks it (InvalidValue:
400 `invalid_value`, naming the field):
- money: a JSON *string* of ASCII digits with at most one '.' followed by 1 to 6 digits ("12.50", "0.000001"),
  at most $10^12. No sign, underscore, exponent, white space, leading or trailing '.', or digits of other scripts.
  A JSON number is refused, as OpenAI's APIs write amounts as strings: 0.1 is never a binary float here.
- priority: a JSON integer in -100..100; not a boolean, a string or 7.0.
- result cursor: `rs_` then 1 to 18 ASCII digits (storage/batches/results.py also refuses one past what exists).

Schemas declare a field with the pydantic types `UsdAmount` (a Decimal of dollars) and `Priority` (an int);
bodies parsed without pydantic (the streamed Message Batch create, the CLI) call `parse_usd` and
`priority_value`. Everything raises the same InvalidValue with the same message.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated

from pydantic import BeforeValidator, ValidationInfo, WithJsonSchema

from storage.errors import InvalidValue

MIN_PRIORITY = -100
MAX_PRIORITY = 100
MAX_USD = Decimal(10) ** 12  # a cap beyond a trillion dollars is a typo, not a budget
USD_PATTERN = r"^[0-9]{1,13}(\.[0-9]{1,6})?$"
_USD = re.compile(USD_PATTERN.strip("^$"), re.ASCII)
_PER_USD = 1_000_000
_CURSOR_DIGITS = re.compile(r"[0-9]{1,18}", re.ASCII)


def usd_amount(value: object, *, param: str) -> Decimal:
    """A money string as an exact Decimal of dollars; InvalidValue otherwise (see the module's rule)."""
    if not isinstance(value, str) or _USD.fullmatch(value) is None or Decimal(value) > MAX_USD:
        raise InvalidValue(
            f'{param} must be a string of US dollars: ASCII digits with up to 6 decimal places, e.g. "12.50" '
            f"(no sign, spaces or exponent; a JSON number is not taken), at most {MAX_USD:.0f}.",
            param=param,
        )
    return Decimal(value)


def micro_usd(amount: Decimal) -> int:
    """Dollars (at most 6 decimal places, as `usd_amount` gives them) as integer micro-dollars."""
    return int(amount * _PER_USD)


def parse_usd(value: object, *, param: str) -> int:
    """A money string as integer micro-dollars (the database's unit); InvalidValue otherwise."""
    return micro_usd(usd_amount(value, param=param))


def priority_value(value: object, *, param: str = "priority") -> int:
    """A batch priority: a JSON integer in -100..100 (not a boolean, string or float); InvalidValue otherwise."""
    if type(value) is not int or not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidValue(
            f"{param} must be an integer between {MIN_PRIORITY} and {MAX_PRIORITY} (a JSON number without a "
            "fraction; not a string or a boolean).",
            param=param,
        )
    return value


def cursor_number(value: str, *, prefix: str, param: str) -> int:
    """The number a cursor `{prefix}{digits}` stands for; InvalidValue unless the digits are 1 to 18 ASCII ones."""
    digits = value[len(prefix) :] if value.startswith(prefix) else None
    if digits is None or _CURSOR_DIGITS.fullmatch(digits) is None:
        raise InvalidValue("Invalid cursor: pass the X-Next-After value of a previous answer.", param=param)
    return int(digits)


def _usd_field(value: object, info: ValidationInfo) -> Decimal:
    return usd_amount(value, param=info.field_name or "amount")


def _priority_field(value: object, info: ValidationInfo) -> int:
    return priority_value(value, param=info.field_name or "priority")


# A schema field of money or priority: the same rule and error as everywhere else (the validator raises the typed
# error itself, which FastAPI renders like any other; pydantic never coerces first). The JSON schema says the rule.
UsdAmount = Annotated[
    Decimal,
    BeforeValidator(_usd_field),
    WithJsonSchema({"type": "string", "pattern": USD_PATTERN, "maxLength": 20, "examples": ["12.50"]}),
]
Priority = Annotated[
    int,
    BeforeValidator(_priority_field),
    WithJsonSchema({"type": "integer", "minimum": MIN_PRIORITY, "maximum": MAX_PRIORITY}),
]
