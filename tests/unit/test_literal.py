"""Log key and shape texts read as literals through a whitelist, never evaluated."""

from __future__ import annotations

import pytest

from tunectl.formats.literal import LiteralError, Symbol, parse_literal


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("('forward', 2, 32, 8, 2048, 2048, 128, 128)", ("forward", 2, 32, 8, 2048, 2048, 128, 128)),
        (
            "('forward', s5, 4, 4, s37, s0, 64, 64)",
            ("forward", Symbol("s5"), 4, 4, Symbol("s37"), Symbol("s0"), 64, 64),
        ),
        ('("backward", -1, None, True, False)', ("backward", -1, None, True, False)),
        ("  ( 1 ,( 2, [3, 4] ), (5,), () , ) ", (1, (2, (3, 4)), (5,), ())),
        ("[2, 32, 2048, 128]", (2, 32, 2048, 128)),
    ],
)
def test_literals_parse_to_their_values(text: str, value: object) -> None:
    assert parse_literal(text) == value


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("__import__('os')", "unexpected \"__import__('os')\" at column 1"),
        ("(1, 2) + (3,)", "unexpected '(1, 2) + (3,)' at column 1"),
        ("os.system('rm -rf /')", "unexpected \"os.system('rm -rf /')\" at column 1"),
        ("('forward', 2*s0, 4)", "unexpected '2*s0' at column 13"),
        ("(lambda: 1)", "unexpected 'lambda: 1' at column 2"),
        ("  (1, s0.real)", "unexpected 's0.real' at column 7"),
        ("(1, 2)(3)", "unexpected '(1, 2)(3)' at column 1"),
        ("(1 2)", "not a literal at column 2"),
        ("(1, 2", "not a literal"),
        ("(, 1)", "not a literal at column 2"),
        ("('a\\'b')", "unexpected"),
        ("'a' 'b'", "unexpected \"'a' 'b'\""),
        ("b'ab'", "unexpected \"b'ab'\""),
        ("1.5", "unexpected '1.5'"),
        ("-s0", "unexpected '-s0'"),
        ("{1: 2}", "unexpected '{1: 2}'"),
        ("", "not a literal"),
        ("x" * 20_000, "too long"),
    ],
)
def test_anything_but_literals_is_refused(text: str, words: str) -> None:
    with pytest.raises(LiteralError) as err:
        parse_literal(text)
    assert words in str(err.value)
