"""Hydra overrides as verl receives them: each prefix, each kind of value, each quoting form
(the shell's quotes first, then Hydra's), and the overrides Hydra would refuse."""

import pytest

from plugrl_tools.convert.overrides import Override, OverrideError, parse_override, parse_value
from plugrl_tools.convert.shell import read_script


@pytest.mark.parametrize(
    ("text", "override"),
    [
        ("a.b=1", Override("a.b", 1)),
        ("+a.b=1", Override("a.b", 1, "+")),
        ("++a.b=1", Override("a.b", 1, "++")),
        ("~a.b", Override("a.b", None, "~")),
        ("~a.b=1", Override("a.b", None, "~")),
        ("a.b-c.d_e=x", Override("a.b-c.d_e", "x")),
        ("a.b=", Override("a.b", "")),
        ("a.b=x=y", Override("a.b", "x=y")),
    ],
)
def test_prefixes_and_keys(text, override):
    assert parse_override(text) == override


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("null", None),
        ("NULL", None),
        ("True", True),
        ("false", False),
        ("8", 8),
        ("-1", -1),
        ("1_000", 1000),
        ("1e-6", 1e-6),
        ("5e-7", 5e-7),
        ("0.", 0.0),
        (".5", 0.5),
        ("-0.1", -0.1),
        ("inf", float("inf")),
        ("left", "left"),
        ("/path/to/file.parquet", "/path/to/file.parquet"),
        ("token-mean", "token-mean"),
        ("a b", "a b"),
        ("'quoted'", "quoted"),
        ('"double quoted"', "double quoted"),
        ("'it\\'s'", "it's"),
        ("'8'", "8"),  # quoted: a string, not a number
        ("'a'b", "'a'b"),
        ("a\\,b", "a,b"),
        ("[console,wandb]", ["console", "wandb"]),
        ("['console', \"wandb\"]", ["console", "wandb"]),
        ("[]", []),
        ("[1, 2.5, null, [x]]", [1, 2.5, None, ["x"]]),
        ("{a: 1, b: [x, 'y']}", {"a": 1, "b": ["x", "y"]}),
    ],
)
def test_values(text, value):
    assert parse_value(text) == value


def test_types_of_numbers():
    assert type(parse_value("8")) is int
    assert type(parse_value("1e-6")) is float
    assert type(parse_value("'8'")) is str


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("=1", "'=1' is not a Hydra override (key=value)"),
        ("a..b=1", "'a..b=1' is not a Hydra override (key=value)"),
        ("a.b", "'a.b' has no value; write a.b=VALUE"),
        ("a.b=[x, y", "'[' is never closed by ']' in '[x, y'"),
        ("a.b={x: 1", "'{' is never closed by '}' in '{x: 1'"),
        ("a.b={x}", "a dict entry is not 'key: value' in '{x}'"),
        ("a.b=['x", "a ' quote is never closed in \"['x\""),
        ("a.b=[x] y", "unexpected 'y' after the value in '[x] y'"),
        (
            "a.b=${data.max_prompt_length}",
            "'${data.max_prompt_length}' is a Hydra interpolation, which reads verl's own "
            "config; write the value",
        ),
        (
            "a.b=['${oc.env:HOME}']",
            "\"['${oc.env:HOME}']\" is a Hydra interpolation, which reads verl's own config; "
            "write the value",
        ),
    ],
)
def test_overrides_hydra_would_refuse(text, message):
    with pytest.raises(OverrideError) as error:
        parse_override(text)
    assert str(error.value) == message


# Each way launch scripts quote a value, through the shell and then Hydra.
QUOTING = r"""
files="/data/a.parquet"
python3 -m verl.trainer.main_ppo \
    plain=left \
    single='left' \
    double="left" \
    hydra_single="'left'" \
    hydra_double='"left"' \
    'whole=left' \
    expanded=$files \
    expanded_quoted="$files" \
    list_unquoted=['console','wandb'] \
    list_single='["console", "wandb"]' \
    list_double="['console','wandb']" \
    list_of_variables="['$files', '$files']" \
    number_quoted="8" \
    number_hydra_quoted="'8'" \
    escaped=a\ b \
    empty=""
"""


def test_quoting_forms_through_the_shell_and_hydra():
    (command,) = read_script(QUOTING).commands
    values = {
        override.key: override.value
        for override in (parse_override(word.text) for word in command.words[3:])
    }
    assert values == {
        "plain": "left",
        "single": "left",
        "double": "left",
        "hydra_single": "left",
        "hydra_double": "left",
        "whole": "left",
        "expanded": "/data/a.parquet",
        "expanded_quoted": "/data/a.parquet",
        "list_unquoted": ["console", "wandb"],
        "list_single": ["console", "wandb"],
        "list_double": ["console", "wandb"],
        "list_of_variables": ["/data/a.parquet", "/data/a.parquet"],
        "number_quoted": 8,
        "number_hydra_quoted": "8",
        "escaped": "a b",
        "empty": "",
    }
