#!/usr/bin/env python
"""Write ``examples/coding_session.json``: a long coding-agent session for the quick start.

The session is ours (nothing copied from other datasets): a coding agent fixes a bug in a small
Python web service, ``shopapi``. It has a system prompt, the user's task, about a hundred
messages of assistant tool calls (``list_dir``, ``read_file``, ``search``, ``run_terminal``,
``write_file``, some in parallel) with long outputs (source files, test runs with tracebacks, a
recursive directory listing, documentation with URLs), a second user message half-way that
adds constraints, a system reminder, and consecutive assistant messages. It measures about
30–40K estimated tokens, so ``ctxengine compact`` at a 32K window has real work to do.

The output is deterministic (no randomness, no clock): run it again and the file is the same
byte for byte. Usage: ``python scripts/make_example.py [OUT]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "examples" / "coding_session.json"

SYSTEM = """You are a careful software engineer working in a terminal on the user's repository.

Tools:
- list_dir(path, recursive=false): list a directory.
- read_file(path, start_line=1, end_line=null): show a file with line numbers.
- search(pattern, path="."): grep the repository (regular expression).
- run_terminal(command, timeout=120): run a shell command in the repository root.
- write_file(path, content): replace a file's content.

Rules:
1. Read before you edit; keep changes minimal and focused on the task.
2. Run the tests after every change and read failures carefully.
3. Never commit secrets; never push. Explain what you changed at the end.
4. Prefer the standard library; ask before adding a dependency.
"""

TASK = """Our order service `shopapi` returns HTTP 500 on `POST /orders` when a customer applies an
expired discount code. It should return 422 with a JSON error `{"error": "discount_expired"}`.
Support ticket SHOP-1432 has the traceback from production:

    Traceback (most recent call last):
      File "/srv/shopapi/shopapi/app.py", line 88, in create_order
        total = apply_discount(cart.total, code, now=clock.now())
      File "/srv/shopapi/shopapi/pricing/discounts.py", line 57, in apply_discount
        raise DiscountExpired(code.code)
    shopapi.pricing.discounts.DiscountExpired: SPRING24

Please fix it, add a regression test, and make sure the whole test suite passes."""

CONSTRAINT = """Two constraints I forgot: do not change the signature of `apply_discount` (the billing
service imports it), and keep Python 3.9 compatibility — no `match` statements and no `X | Y`
type unions at runtime. Also please check docs/errors.md, it documents the error codes."""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": props, "required": list(props)[:1]},
        },
    }
    for name, desc, props in [
        ("list_dir", "List a directory.", {"path": {"type": "string"}, "recursive": {"type": "boolean"}}),
        ("read_file", "Show a file with line numbers.", {"path": {"type": "string"}, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}}),
        ("search", "Grep the repository.", {"pattern": {"type": "string"}, "path": {"type": "string"}}),
        ("run_terminal", "Run a shell command.", {"command": {"type": "string"}, "timeout": {"type": "integer"}}),
        ("write_file", "Replace a file's content.", {"path": {"type": "string"}, "content": {"type": "string"}}),
    ]
]

MODULES = ["app", "models", "storage", "auth", "pricing/discounts", "pricing/taxes", "pricing/currency", "api/errors", "api/schemas", "util/clock"]


def numbered(text: str, start: int = 1) -> str:
    return "\n".join(f"{i:4d}  {line}" for i, line in enumerate(text.splitlines(), start))


def discounts_py(fixed: bool) -> str:
    check = (
        "    if code.expires_at is not None and now >= code.expires_at:\n"
        "        raise DiscountExpired(code.code)\n"
    )
    lines = [
        '"""Discount codes: lookup, validation and application."""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass",
        "from datetime import datetime",
        "from decimal import Decimal, ROUND_HALF_UP",
        "from typing import Optional",
        "",
        "from shopapi.storage import DiscountStore",
        "",
        "",
        "class DiscountError(Exception):",
        '    """Base class of discount problems; each maps to an API error code."""',
        "",
        '    code = "discount_invalid"',
        "",
        "",
        "class DiscountExpired(DiscountError):",
        '    code = "discount_expired"',
        "",
        "",
        "class DiscountUnknown(DiscountError):",
        '    code = "discount_unknown"',
        "",
        "",
        "@dataclass(frozen=True)",
        "class DiscountCode:",
        "    code: str",
        "    percent: Decimal",
        "    expires_at: Optional[datetime] = None",
        "    min_total: Decimal = Decimal('0')",
        "",
        "",
        "def lookup(store: DiscountStore, raw: str) -> DiscountCode:",
        "    row = store.get(raw.strip().upper())",
        "    if row is None:",
        "        raise DiscountUnknown(raw)",
        "    return DiscountCode(row['code'], Decimal(row['percent']), row.get('expires_at'), Decimal(row.get('min_total', '0')))",
        "",
        "",
        "def _round(value: Decimal) -> Decimal:",
        "    return value.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP)",
        "",
        "",
        "def apply_discount(total: Decimal, code: Optional[DiscountCode], now: datetime) -> Decimal:",
        '    """Return ``total`` after ``code``; raises DiscountError subclasses on bad codes."""',
        "    if code is None:",
        "        return total",
        "    if total < code.min_total:",
        "        return total",
        "    # expired codes must not apply; the API layer turns this into a 422",
        check.rstrip("\n"),
        "    return _round(total * (Decimal('100') - code.percent) / Decimal('100'))",
    ]
    return "\n".join(lines) + "\n"


def app_py(fixed: bool) -> str:
    handler = (
        [
            "    try:",
            "        total = apply_discount(cart.total, code, now=clock.now())",
            "    except DiscountError as exc:",
            "        return error_response(422, exc.code, detail=str(exc))",
        ]
        if fixed
        else ["    total = apply_discount(cart.total, code, now=clock.now())"]
    )
    body = [
        '"""The HTTP layer of shopapi: routes, request parsing, error responses."""',
        "",
        "from __future__ import annotations",
        "",
        "import logging",
        "from decimal import Decimal",
        "",
        "from shopapi.api.errors import error_response",
        "from shopapi.api.schemas import OrderRequest, parse_order",
        "from shopapi.models import Cart, Order",
        "from shopapi.pricing.discounts import DiscountError, apply_discount, lookup",
        "from shopapi.pricing.taxes import add_tax",
        "from shopapi.storage import Storage",
        "from shopapi.util import clock",
        "",
        "log = logging.getLogger('shopapi.app')",
        "",
    ]
    for i, name in enumerate(["health", "list_products", "get_product", "get_cart", "add_to_cart", "remove_from_cart"]):
        body += [
            f"@route('GET', '/{name.replace('_', '/')}')",
            f"def {name}(request, storage: Storage):",
            f'    """Handler {i}: {name.replace("_", " ")}."""',
            f"    log.debug('{name} %s', request.path)",
            f"    data = storage.fetch('{name}', request.params)",
            "    if data is None:",
            "        return error_response(404, 'not_found')",
            "    return {'status': 200, 'body': data}",
            "",
        ]
    body += [
        "@route('POST', '/orders')",
        "def create_order(request, storage: Storage):",
        "    req: OrderRequest = parse_order(request.json)",
        "    cart: Cart = storage.cart(req.cart_id)",
        "    code = lookup(storage.discounts, req.discount_code) if req.discount_code else None",
        *handler,
        "    total = add_tax(total, cart.region)",
        "    order = Order.create(cart, total)",
        "    storage.save(order)",
        "    return {'status': 201, 'body': order.to_json()}",
    ]
    return "\n".join(body) + "\n"


def listing() -> str:
    lines = ["shopapi/"]
    for d in ["shopapi", "shopapi/api", "shopapi/pricing", "shopapi/util", "tests", "tests/api", "tests/pricing", "docs", "scripts", "migrations"]:
        for j in range(8):
            stem = ["__init__", "core", "helpers", "routes", "models", "fixtures", "test_basic", "conftest"][j]
            ext = ".md" if d == "docs" else ".sql" if d == "migrations" else ".py"
            lines.append(f"  {d}/{stem}{ext}  {1200 + 37 * j + len(d) * 11} bytes")
    lines += ["  pyproject.toml  1834 bytes", "  README.md  4120 bytes", "  .github/workflows/ci.yml  912 bytes"]
    return "\n".join(lines)


def pytest_run(failing: list[str], passed: int, fixed_hint: bool = False) -> str:
    out = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.9.18, pytest-7.4.4, pluggy-1.3.0",
        "rootdir: /srv/shopapi, configfile: pyproject.toml",
        f"collected {passed + len(failing)} items",
        "",
    ]
    for mod in ["tests/api/test_orders.py", "tests/api/test_products.py", "tests/pricing/test_discounts.py", "tests/pricing/test_taxes.py"]:
        marks = "".join("F" if any(f.startswith(mod) for f in failing) and k == 3 else "." for k in range(12))
        out.append(f"{mod} {marks}")
    out.append("")
    if failing:
        out.append("=================================== FAILURES ===================================")
    for f in failing:
        test = f.split("::")[1]
        out += [
            f"_________________________ {test} _________________________",
            "",
            "client = <shopapi.testing.Client object at 0x7f3a2c1b9d30>",
            "",
            f"    def {test}(client):",
            "        client.seed_discount('SPRING24', percent=10, expires_at=YESTERDAY)",
            "        resp = client.post('/orders', json={'cart_id': 'c-1', 'discount_code': 'SPRING24'})",
            ">       assert resp.status == 422",
            "E       assert 500 == 422",
            "E        +  where 500 = <Response [500]>.status",
            "",
            f"{f.split('::')[0]}:41: AssertionError",
            "----------------------------- Captured log call ------------------------------",
            "ERROR    shopapi.app:app.py:88 unhandled exception in create_order",
            "Traceback (most recent call last):",
            '  File "/srv/shopapi/shopapi/app.py", line 88, in create_order',
            "    total = apply_discount(cart.total, code, now=clock.now())",
            '  File "/srv/shopapi/shopapi/pricing/discounts.py", line 57, in apply_discount',
            "    raise DiscountExpired(code.code)",
            "shopapi.pricing.discounts.DiscountExpired: SPRING24",
            "",
        ]
    if failing:
        out.append("=========================== short test summary info ============================")
        out += [f"FAILED {f} - assert 500 == 422" for f in failing]
        out.append(f"========================= {len(failing)} failed, {passed} passed in 2.41s =========================")
    else:
        out.append(f"============================== {passed} passed in 2.37s ==============================")
    return "\n".join(out)


def docs_errors() -> str:
    rows = [
        ("discount_expired", 422, "The discount code is past its expiry date."),
        ("discount_unknown", 422, "No discount code with that name exists."),
        ("discount_invalid", 422, "The discount code cannot be applied to this cart."),
        ("not_found", 404, "The resource does not exist."),
        ("cart_empty", 409, "The cart has no items."),
        ("payment_declined", 402, "The payment provider declined the charge."),
    ]
    out = [
        "# Error codes",
        "",
        "Every error response has the shape `{\"error\": <code>, \"detail\": <text>}` and follows",
        "RFC 9457 where it can: https://www.rfc-editor.org/rfc/rfc9457.html",
        "",
        "| code | HTTP status | meaning |",
        "|---|---|---|",
    ]
    out += [f"| `{c}` | {s} | {m} |" for c, s, m in rows]
    out += [
        "",
        "Clients retry only on 5xx. See the client guide at https://docs.shopapi.example.com/clients/retries",
        "and the status page https://status.shopapi.example.com for incidents.",
        "",
        "## Adding a code",
        "",
        "1. Add the exception class in `shopapi/pricing/discounts.py` or `shopapi/api/errors.py`.",
        "2. Map it in `shopapi/api/errors.py::ERROR_STATUS`.",
        "3. Document it here and in `docs/changelog.md`.",
    ]
    return "\n".join(out * 1)


def readme() -> str:
    return "\n".join([
        "# shopapi",
        "",
        "The order service behind the shop. Docs: https://docs.shopapi.example.com/ ; API reference:",
        "https://docs.shopapi.example.com/api/v2/orders ; issue tracker: https://tracker.example.com/projects/SHOP",
        "",
        "## Running locally",
        "",
        "    python -m venv .venv && . .venv/bin/activate",
        "    pip install -e '.[test]'",
        "    python -m shopapi.devserver --port 8080",
        "",
        "## API contract",
        "",
        *[f"- `{verb} {path}`: {what}" for verb, path, what in [
            ("GET", "/products", "list products, paginated (`?page=`, `?per_page=` up to 100)"),
            ("GET", "/products/{id}", "one product; 404 `not_found` when missing"),
            ("GET", "/cart/{id}", "a cart with its items and totals"),
            ("POST", "/cart/{id}/items", "add an item; 409 `cart_locked` after checkout started"),
            ("POST", "/orders", "create an order from a cart; 201, or 422 with an error code from docs/errors.md"),
            ("GET", "/orders/{id}", "an order; 404 `not_found` when missing"),
        ]],
        "",
        "Error responses are documented in docs/errors.md; the schema lives in shopapi/api/schemas.py.",
        "Release notes: docs/changelog.md. Security contact: security@shopapi.example.com.",
        *[f"Note {k}: the pricing pipeline runs discount, tax and currency steps in that order; rounding is half-up to cents." for k in range(12)],
    ])


def git_log() -> str:
    subjects = [
        "pricing: add min_total to discount codes", "pricing: round half-up to cents", "taxes: EU VAT table 2024",
        "currency: cache FX rates for 10 minutes", "discounts: uppercase codes on lookup", "discounts: add expires_at",
        "pricing: split taxes out of discounts", "currency: support JPY without decimals", "taxes: fix Quebec rate",
        "discounts: DiscountUnknown error code", "pricing: type hints", "pricing: docstrings",
    ]
    return "\n".join(f"{(0x9f3a1c7 + 7919 * k) & 0xFFFFFFF:07x} {subjects[k % len(subjects)]}" for k in range(25))


def git_diff() -> str:
    return "\n".join([
        " shopapi/api/errors.py                  |  1 +",
        " shopapi/app.py                         |  6 +++++-",
        " tests/api/test_orders_discounts.py     | 38 ++++++++++++++++++++++++++++++++++++++",
        " 3 files changed, 44 insertions(+), 1 deletion(-)",
        "diff --git a/shopapi/app.py b/shopapi/app.py",
        "--- a/shopapi/app.py",
        "+++ b/shopapi/app.py",
        "@@ -85,7 +85,11 @@ def create_order(request, storage: Storage):",
        "     code = lookup(storage.discounts, req.discount_code) if req.discount_code else None",
        "-    total = apply_discount(cart.total, code, now=clock.now())",
        "+    try:",
        "+        total = apply_discount(cart.total, code, now=clock.now())",
        "+    except DiscountError as exc:",
        "+        return error_response(422, exc.code, detail=str(exc))",
        *[f"+# regression test line {k}: expired, unknown and below-minimum codes" for k in range(30)],
    ])


def generic_module(name: str, n: int) -> str:
    out = [f'"""shopapi.{name.replace("/", ".")}: part of the order service."""', "", "from __future__ import annotations", "", "import logging", "from typing import Any, Dict, List, Optional", ""]
    for i in range(n):
        out += [
            f"def {name.split('/')[-1]}_step_{i}(payload: Dict[str, Any], limit: Optional[int] = None) -> List[str]:",
            f'    """Step {i} of the {name} pipeline: validate, normalise and return the keys it touched."""',
            "    keys = sorted(k for k in payload if not k.startswith('_'))",
            "    if limit is not None:",
            "        keys = keys[:limit]",
            f"    logging.getLogger('shopapi.{name.replace('/', '.')}').debug('step {i}: %d keys', len(keys))",
            "    return keys",
            "",
        ]
    return "\n".join(out)


class Session:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
        self.n = 0

    def call(self, thought: str | None, *calls: tuple[str, dict[str, Any], str]) -> None:
        tool_calls = []
        results = []
        for name, args, output in calls:
            self.n += 1
            cid = f"call_{self.n:03d}"
            tool_calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}})
            results.append({"role": "tool", "tool_call_id": cid, "name": name, "content": output})
        self.messages.append({"role": "assistant", "content": thought, "tool_calls": tool_calls})
        self.messages += results

    def say(self, text: str, role: str = "assistant") -> None:
        self.messages.append({"role": role, "content": text})


def build() -> dict[str, Any]:
    s = Session()
    s.call("I'll start by looking at the repository layout.", ("list_dir", {"path": ".", "recursive": True}, listing()))
    s.call(
        "The traceback points at app.py and pricing/discounts.py; reading both.",
        ("read_file", {"path": "shopapi/app.py"}, numbered(app_py(False))),
        ("read_file", {"path": "shopapi/pricing/discounts.py"}, numbered(discounts_py(False))),
    )
    s.call("Let me reproduce the failure first.", ("run_terminal", {"command": "python -m pytest -q tests/api/test_orders.py"}, pytest_run(["tests/api/test_orders.py::test_expired_discount_returns_422"], 11)))
    s.call("Where are DiscountError subclasses handled today?", ("search", {"pattern": "DiscountError|DiscountExpired", "path": "shopapi"},
        "shopapi/pricing/discounts.py:13:class DiscountError(Exception):\nshopapi/pricing/discounts.py:19:class DiscountExpired(DiscountError):\n"
        "shopapi/pricing/discounts.py:23:class DiscountUnknown(DiscountError):\nshopapi/pricing/discounts.py:57:        raise DiscountExpired(code.code)\n"
        "shopapi/app.py:11:from shopapi.pricing.discounts import DiscountError, apply_discount, lookup\nshopapi/api/errors.py:30:    'discount_unknown': 422,"))
    s.call(None, ("read_file", {"path": "shopapi/api/errors.py"}, numbered(
        '"""Error responses."""\n\nfrom __future__ import annotations\n\nERROR_STATUS = {\n' + "".join(f"    '{c}': {st},\n" for c, st in [("not_found", 404), ("cart_empty", 409), ("payment_declined", 402), ("discount_unknown", 422)]) +
        "}\n\n\ndef error_response(status: int, code: str, detail: str = '') -> dict:\n    return {'status': status, 'body': {'error': code, 'detail': detail}}\n")))
    for name in MODULES[1:4]:
        s.call(f"Reading shopapi/{name}.py for context on how errors propagate.", ("read_file", {"path": f"shopapi/{name}.py"}, numbered(generic_module(name, 18))))
    s.call("Reading the README for the documented API contract.", ("read_file", {"path": "README.md"}, numbered(readme())))
    s.call("Checking recent history of the pricing package.", ("run_terminal", {"command": "git log --oneline -n 25 -- shopapi/pricing"}, git_log()))
    s.call(
        "Checking the test helpers and the existing discount tests in parallel.",
        ("read_file", {"path": "tests/conftest.py"}, numbered(generic_module("tests/conftest", 10))),
        ("read_file", {"path": "tests/pricing/test_discounts.py"}, numbered(generic_module("tests/pricing/test_discounts", 10))),
        ("search", {"pattern": "expires_at", "path": "."}, "\n".join(f"shopapi/pricing/discounts.py:{31 + k}:    expires_at ... ({k})" for k in range(6)) + "\nmigrations/core.sql:12:  expires_at TIMESTAMP NULL,\ntests/pricing/test_discounts.py:40:    seed(expires_at=YESTERDAY)"),
    )
    s.say("The root cause is clear: `create_order` calls `apply_discount` without handling `DiscountError`, so `DiscountExpired` escapes as a 500.")
    s.say("Plan: catch `DiscountError` in `create_order` and return `error_response(422, exc.code)`; register `discount_expired` in ERROR_STATUS; add a regression test.")
    s.say(CONSTRAINT, role="user")
    s.call("Understood — the signature of apply_discount stays as is. Reading docs/errors.md.", ("read_file", {"path": "docs/errors.md"}, numbered(docs_errors())))
    s.call("Checking which Python version CI uses.", ("read_file", {"path": ".github/workflows/ci.yml"}, numbered(
        "name: ci\non: [push, pull_request]\njobs:\n  test:\n    runs-on: ubuntu-latest\n    strategy:\n      matrix:\n        python: ['3.9', '3.10', '3.11', '3.12']\n    steps:\n"
        "      - uses: actions/checkout@v4\n      - uses: actions/setup-python@v5\n        with:\n          python-version: ${{ matrix.python }}\n      - run: pip install -e '.[test]'\n      - run: python -m pytest -q\n")))
    s.call("Applying the fix in app.py.", ("write_file", {"path": "shopapi/app.py", "content": app_py(True)}, "wrote 2417 bytes to shopapi/app.py"))
    s.call(None, ("run_terminal", {"command": "python -m pytest -q tests/api/test_orders.py"}, pytest_run([], 12)))
    s.say("[reminder] Keep responses short; the user reads them on a phone.", role="system")
    s.call("Adding the regression test.", ("write_file", {"path": "tests/api/test_orders_discounts.py", "content": generic_module("tests/api/test_orders_discounts", 4)}, "wrote 1290 bytes to tests/api/test_orders_discounts.py"))
    s.call("Running the full suite.", ("run_terminal", {"command": "python -m pytest -q"}, pytest_run(["tests/pricing/test_discounts.py::test_expired_code_message"], 47)))
    s.call("A pricing test fails; reading it.", ("read_file", {"path": "tests/pricing/test_discounts.py", "start_line": 30, "end_line": 60}, numbered(generic_module("tests/pricing/test_discounts", 5), 30)))
    s.call(
        "Comparing the module versions in parallel before touching anything else.",
        ("read_file", {"path": "shopapi/pricing/taxes.py"}, numbered(generic_module("pricing/taxes", 12))),
        ("read_file", {"path": "shopapi/pricing/currency.py"}, numbered(generic_module("pricing/currency", 12))),
    )
    s.call("The failing test expects the code name in the message; checking the exception's __str__.", ("run_terminal", {"command": "python -c \"from shopapi.pricing.discounts import DiscountExpired; print(repr(str(DiscountExpired('SPRING24'))))\""}, "'SPRING24'"))
    s.call("The detail text was already the code; the failure is the unregistered status. Registering it.", ("write_file", {"path": "shopapi/api/errors.py", "content": "ERROR_STATUS = {'discount_expired': 422}\n"}, "wrote 611 bytes to shopapi/api/errors.py"))
    for k in range(3):
        name = MODULES[4 + k]
        s.call(f"Double-checking shopapi/{name}.py for other unhandled raises.", ("read_file", {"path": f"shopapi/{name}.py"}, numbered(generic_module(name, 16))))
    s.call("Running the suite again.", ("run_terminal", {"command": "python -m pytest -q"}, pytest_run(["tests/api/test_orders.py::test_discount_on_empty_cart", "tests/api/test_products.py::test_flaky_stock_cache"], 46)))
    s.call("Two failures; one looks flaky. Re-running just those.", ("run_terminal", {"command": "python -m pytest -q -p no:randomly tests/api/test_orders.py::test_discount_on_empty_cart tests/api/test_products.py::test_flaky_stock_cache"}, pytest_run(["tests/api/test_orders.py::test_discount_on_empty_cart"], 1)))
    s.call("The empty-cart case hits the new handler before the cart check; reading the storage cart code.", ("read_file", {"path": "shopapi/storage.py", "start_line": 1, "end_line": 160}, numbered(generic_module("storage", 20))))
    s.call("Moving the discount lookup after the empty-cart check.", ("write_file", {"path": "shopapi/app.py", "content": app_py(True) + "\n# cart emptiness is checked before discounts (SHOP-1432)\n"}, "wrote 2489 bytes to shopapi/app.py"))
    s.call("Running the suite again.", ("run_terminal", {"command": "python -m pytest -q"}, pytest_run([], 48)))
    s.call("Showing the final diff.", ("run_terminal", {"command": "git diff --stat && git diff"}, git_diff()))
    s.call("Type-checking under the 3.9 target to honour the constraint.", ("run_terminal", {"command": "python -m mypy --python-version 3.9 shopapi"}, "Success: no issues found in 24 source files"))
    s.call("Checking the docs mention the code.", ("search", {"pattern": "discount_expired", "path": "docs"}, "docs/errors.md:10:| `discount_expired` | 422 | The discount code is past its expiry date. |"))
    s.say("The docs already document `discount_expired` as 422, so no doc change is needed.")
    s.say("Summary of the change follows.")
    for k in range(4):
        name = ["storage", "models", "auth", "util/clock"][k]
        s.call(f"Final look at shopapi/{name}.py for Python 3.10-only syntax.", ("search", {"pattern": "match |\\w+ \\| None", "path": f"shopapi/{name}.py"}, "no matches"))
    s.call("Last full run with coverage for the touched modules.", ("run_terminal", {"command": "python -m pytest -q --cov=shopapi.app --cov=shopapi.api.errors"}, pytest_run([], 48) + "\n\n---------- coverage: platform linux, python 3.9.18 -----------\nName                      Stmts   Miss  Cover\n---------------------------------------------\nshopapi/app.py               61      2    97%\nshopapi/api/errors.py         9      0   100%\n---------------------------------------------\nTOTAL                        70      2    97%"))
    s.say(
        "Fixed: `POST /orders` now returns 422 with `{\"error\": \"discount_expired\"}` for expired codes.\n\n"
        "- shopapi/app.py: `create_order` catches `DiscountError` and returns `error_response(422, exc.code)`.\n"
        "- shopapi/api/errors.py: `discount_expired` registered as 422.\n"
        "- tests/api/test_orders_discounts.py: regression test for SHOP-1432.\n\n"
        "`apply_discount` keeps its signature and everything stays Python 3.9 compatible; the full suite passes (48 tests)."
    )
    return {
        "id": "example-shopapi-expired-discount",
        "messages": s.messages,
        "tools": TOOLS,
        "meta": {"source": "written for ctxengine's quick start by scripts/make_example.py", "license": "MIT"},
    }


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(build(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
