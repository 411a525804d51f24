"""A server's answers to resuming HELLOs, without connections (m2mwire/session/resumption.py;
the same rules over real sockets: tests/test_resume.py, tests/test_resume_hostile.py)."""

from __future__ import annotations

import pytest

from m2mwire.session.resumption import ENDED_IDS_KEPT, EndedSessions, replay_delay, resume_refusal


def refusal(**overrides: object) -> tuple[str, str] | None:
    args: dict[str, object] = {
        "live": True,
        "ended": None,
        "token_ok": True,
        "accepts": True,
        "resume_window": 60.0,
    }
    args.update(overrides)
    return resume_refusal(**args)  # type: ignore[arg-type]


def test_a_live_session_with_its_token_resumes() -> None:
    assert refusal() is None


@pytest.mark.parametrize(
    ("overrides", "code", "words"),
    [
        ({"live": False, "ended": "RESUME_EXPIRED"}, "RESUME_EXPIRED", "waited 60 s (resume_window)"),
        ({"live": False, "ended": "NORMAL"}, "RESUME_UNKNOWN", "has ended (NORMAL)"),
        ({"live": False}, "RESUME_UNKNOWN", "does not know the session"),
        ({"token_ok": False}, "RESUME_REFUSED", "wrong resume token"),
        ({"token_ok": False, "accepts": False}, "RESUME_REFUSED", "wrong resume token"),  # token first
        ({"accepts": False}, "RESUME_UNKNOWN", "is closing"),
    ],
)
def test_each_refusal_says_why(overrides: dict[str, object], code: str, words: str) -> None:
    got = refusal(**overrides)
    assert got is not None and got[0] == code and words in got[1]


def test_ended_sessions_are_remembered_up_to_a_bound() -> None:
    ended = EndedSessions()
    for i in range(ENDED_IDS_KEPT + 5):
        ended.record(f"s{i}", "NORMAL" if i % 2 else "RESUME_EXPIRED")
    assert ended.get("s0") is None and ended.get("s4") is None  # the oldest are forgotten
    assert ended.get(f"s{ENDED_IDS_KEPT + 4}") == "RESUME_EXPIRED"
    assert len(ended._codes) == ENDED_IDS_KEPT


def test_a_replay_waits_at_most_half_the_handshake_time() -> None:
    assert replay_delay(0.0, 30.0) == 0.0
    assert replay_delay(2.5, 30.0) == 2.5
    assert replay_delay(100.0, 30.0) == 15.0
