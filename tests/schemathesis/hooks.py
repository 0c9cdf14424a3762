"""schemathesis hooks for hf3fs-meta (loaded through SCHEMATHESIS_HOOKS).

One check, `documented_server_errors`, takes the place of schemathesis's
`not_a_server_error`: a 5xx fails the run unless it is one of the 500s that
docs/api.md documents, each recognised by its exact shape:

- confirm_write (vLLM's and SGLang's): the typed error, `{"detail":
  "Confirmation failed: ...", "error": {"code": <a documented code>, "rank": ...}}`;
- batch_allocate: `{"detail": "Allocation failed: Rank R not initialized"}`;
- get_locations: `{"detail": "Failed to get key locations: Rank R not initialized"}`.

Any other 5xx (502, 503, 507, an untyped 500, ...) is a failure.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import schemathesis

# Every typed code of confirm_write: docs/error-codes.json, generated from the
# core's ErrorCode::ALL (core/src/error.rs).
TYPED_CODES = set(json.loads((Path(__file__).resolve().parents[2] / "docs" / "error-codes.json").read_text())["codes"])
UNINITIALIZED = {
    "/keys/batch_allocate": re.compile(r"Allocation failed: Rank -?\d+ not initialized"),
    "/keys/get_locations": re.compile(r"Failed to get key locations: Rank -?\d+ not initialized"),
}


def documented_500(path: str, status: int, body: bytes) -> str | None:
    """None when the answer is a documented 500, else why it is not."""
    if status != 500:
        return f"status {status} is not a documented server error"
    try:
        doc = json.loads(body)
    except ValueError:
        return "a 500 whose body is not JSON"
    if not isinstance(doc, dict) or not isinstance(doc.get("detail"), str):
        return "a 500 without a detail string"
    detail = doc["detail"]
    if path in ("/keys/confirm_write", "/{rank}/confirm_write"):
        err = doc.get("error")
        if (
            detail.startswith("Confirmation failed: ")
            and isinstance(err, dict)
            and err.get("code") in TYPED_CODES
            and isinstance(err.get("rank"), int)
        ):
            return None
        return "an untyped 500 from confirm_write"
    pattern = UNINITIALIZED.get(path)
    if pattern is not None and pattern.fullmatch(detail) and set(doc) == {"detail"}:
        return None
    return f"an undocumented 500 from {path}: {detail!r}"


@schemathesis.check
def documented_server_errors(ctx, response, case):
    if response.status_code < 500:
        return None
    why = documented_500(case.path, response.status_code, response.content)
    if why is not None:
        raise AssertionError(f"Server error: {why}")
    return None


def _self_test() -> None:
    """The check's verdicts on fixed answers (run by run.sh before the run)."""
    typed = b'{"detail":"Confirmation failed: x","error":{"code":"double_release","rank":0,"page":1}}'
    assert documented_500("/keys/confirm_write", 500, typed) is None
    assert documented_500("/keys/confirm_write", 500, b'{"detail":"Confirmation failed: x"}')
    late = b'{"detail":"Confirmation failed: x","error":{"code":"reserved_for_other_key","rank":0,"page":1}}'
    assert documented_500("/keys/confirm_write", 500, late) is None
    assert documented_500("/keys/confirm_write", 500, typed.replace(b"double_release", b"no_such_code"))
    assert documented_500("/keys/confirm_write", 502, typed)
    assert documented_500("/{rank}/confirm_write", 500, typed) is None
    assert documented_500("/{rank}/exists", 500, b'{"detail":"anything"}')
    assert documented_500("/keys/batch_allocate", 500, b'{"detail":"Allocation failed: Rank -3 not initialized"}') is None
    assert documented_500("/keys/batch_allocate", 500, b'{"detail":"Allocation failed: boom"}')
    assert documented_500("/keys/get_locations", 500, b'{"detail":"Failed to get key locations: Rank 9 not initialized"}') is None
    assert documented_500("/keys/batch_exists", 500, b'{"detail":"anything"}')
    assert documented_500("/rank/0/initialize", 507, b'{"detail":"Cannot create rank"}')
    assert documented_500("/stats", 500, b"Internal Server Error")


if __name__ == "__main__":
    _self_test()
