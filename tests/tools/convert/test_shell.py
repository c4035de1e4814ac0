"""Reading a bash script without running it: each expansion form, quoting, arithmetic, what
cannot be resolved and why, and the errors of a script that cannot be read."""

import pytest

from plugrl.errors import ConvertError
from plugrl_tools.convert.shell import Unresolved, read_script


def variables(text, env=None):
    return read_script(text, env).variables


def words(text, env=None):
    """The words of the script's last command, as the command receives them."""
    return [word.text for word in read_script(text, env).commands[-1].words]


# ------------------------------------------------------------------ expansion forms


def test_plain_values_and_quotes():
    assert variables("A=plain\nB='single $A'\nC=\"double $A\"\nD=\nE=a\\ b") == {
        "A": "plain",
        "B": "single $A",
        "C": "double plain",
        "D": "",
        "E": "a b",
    }


@pytest.mark.parametrize(
    ("script", "value"),
    [
        ("A=1\nB=$A", "1"),
        ("A=1\nB=${A}x", "1x"),
        ("B=${A:-fallback}", "fallback"),
        ("A=\nB=${A:-fallback}", "fallback"),
        ("A=\nB=${A-fallback}", ""),
        ("A=set\nB=${A:-fallback}", "set"),
        ("A=set\nB=${A:+other}", "other"),
        ("B=${A:+other}", ""),
        ('B=${A:-"${HOME}/verl"}', "/home/me/verl"),
        ("B=${A:-$((2 * 3))}", "6"),
    ],
)
def test_parameter_expansions(script, value):
    assert variables(script, {"HOME": "/home/me"})["B"] == value


def test_assign_default_sets_the_variable():
    assert variables("B=${A:=7}") == {"A": "7", "B": "7"}


def test_environment_defaults_give_way_to_env():
    script = "NNODES=${NNODES:-1}\nGPUS=${GPUS:-8}"
    assert variables(script, {"NNODES": "4"}) == {"NNODES": "4", "GPUS": "8"}


def test_export_and_declare_set_and_export():
    script = "export A=1 B\nB=2\ndeclare -x C=3\nlocal D=4\nreadonly E=$A$B"
    result = read_script(script)
    assert result.variables == {"A": "1", "B": "2", "C": "3", "D": "4", "E": "12"}
    assert result.exported == ["A", "B", "C"]


def test_unset_and_append():
    assert variables("A=1\nunset A\nB=x\nB+=y") == {"B": "xy"}


# ---------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1024 * 2", "2048"),
        ("(p + r) / 4", "1280"),
        ("(p + r)", "5120"),
        ("p / 3", "682"),
        ("-7 / 2", "-3"),  # bash truncates toward zero
        ("-7 % 2", "-1"),
        ("2 ** 10", "1024"),
        ("$p + ${r}", "5120"),
        ("p * 1 - 1", "2047"),
        ("nested * 2", "10"),  # a variable holding an expression
    ],
)
def test_arithmetic(expression, value):
    script = f"p=2048\nr=3072\nnested='2 + 3'\nX=$(({expression}))"
    assert variables(script)["X"] == value


def test_arithmetic_of_a_variable_set_to_another():
    assert variables("A=2\nB=$A\nC=$((B*3))\nD=$(((A+B)*2))")["D"] == "8"


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("missing + 1", "$((missing + 1)): $missing is not set in the script"),
        ("1 / 0", "$((1 / 0)): division by zero"),
        ("1.5 * 2", "$((1.5 * 2)): '1.5' is not integer arithmetic evaluated here"),
        (
            "a > 1 ? 2 : 3",
            "$((a > 1 ? 2 : 3)): 'a > 1 ? 2 : 3' is not integer arithmetic evaluated here",
        ),
        # as in bash, a variable's value is read as an expression: abc is a name
        ("word * 2", "$((word * 2)): $abc is not set in the script"),
    ],
)
def test_arithmetic_that_cannot_be_evaluated(expression, reason):
    result = variables(f"word=abc\nX=$(({expression}))")["X"]
    assert result == Unresolved(reason)


# --------------------------------------------------------------------- unresolved


def test_undefined_variable_is_unresolved_with_its_name():
    assert variables('MODEL="${MODEL_PATH}/x"')["MODEL"] == Unresolved(
        "$MODEL_PATH is not set in the script"
    )


def test_command_substitution_is_not_run():
    found = variables('LOG="log_$(date +%Y%m%d).txt"\nB=`hostname`')
    assert found["LOG"] == Unresolved("$(date +%Y%m%d) runs a command, and nothing is run here")
    assert found["B"] == Unresolved("`hostname` runs a command, and nothing is run here")


def test_unsupported_expansions_say_so():
    found = variables("A=abc\nB=${A/b/c}\nC=${#A}\nD=$1")
    assert found["B"] == Unresolved(
        "${A/b/c} is not evaluated here (only ${NAME}, ${NAME:-default} and the like are)"
    )
    assert found["C"] == Unresolved("${#A} is not an expansion evaluated here")
    assert found["D"] == Unresolved("$1 depends on how the script is called")


def test_unresolved_words_keep_their_source():
    (word,) = read_script('echo model="${MODEL_PATH}"').commands[0].words[1:]
    assert word.text == "model=${MODEL_PATH}"
    assert word.unresolved == ("$MODEL_PATH is not set in the script",)


# --------------------------------------------------------------------- conditions


def test_if_with_a_decidable_test():
    script = (
        'mode="async"\n'
        'if [ "$mode" = "async" ]; then\n    export VLLM_USE_V1=1\n    raw="True"\n'
        "else\n    raw=False\nfi\n"
        'if [[ $mode != async ]]; then other=1; elif [ -n "$mode" ]; then other=2; fi'
    )
    result = read_script(script)
    assert result.variables["raw"] == "True"
    assert result.variables["other"] == "2"
    assert result.exported == ["VLLM_USE_V1"]


def test_if_that_cannot_be_decided_leaves_its_assignments_unresolved():
    script = 'A=1\nif [ "$(hostname)" = head ]; then\n  A=2\nfi\nfor x in 1 2; do B=$x; done'
    found = variables(script)
    assert found["A"] == Unresolved(
        "$A is set in a loop or under a condition that cannot be decided here (line 3)"
    )
    assert found["B"] == Unresolved(
        "$B is set in a loop or under a condition that cannot be decided here (line 5)"
    )


# --------------------------------------------------------------- words of commands


def test_continuations_comments_redirections_and_pipes():
    script = (
        "python3 -m verl.trainer.main_ppo \\\n"
        "    a.b=1 \\\n"
        "    # c.d=2 \\\n"
        "    e.f='x y' $@ 2>&1 | tee log.txt # the log\n"
    )
    result = read_script(script)
    main, tee = result.commands
    assert [word.text for word in main.words] == [
        "python3",
        "-m",
        "verl.trainer.main_ppo",
        "a.b=1",
        "e.f=x y",
    ]
    assert main.passes_arguments and main.comment_lines == (3,)
    assert [word.text for word in tee.words] == ["tee", "log.txt"]


def test_unquoted_expansions_split_into_words():
    assert words('EXTRA="a=1 b=2"\ncmd $EXTRA "$EXTRA" ""') == ["cmd", "a=1", "b=2", "a=1 b=2", ""]


def test_quoting_forms_reach_the_command_as_hydra_sees_them():
    script = (
        "cmd a='left' b=\"quoted $X\" c=['console','wandb'] d='[\"console\"]' "
        "e=\"'hydra quoted'\" 'f=whole word' g=\\$literal"
    )
    assert words(script, {"X": "x"})[1:] == [
        "a=left",
        "b=quoted x",
        "c=[console,wandb]",
        'd=["console"]',
        "e='hydra quoted'",
        "f=whole word",
        "g=$literal",
    ]


def test_heredocs_are_skipped():
    script = "python3 - <<EOF\nA=inside\nEOF\nB=after"
    assert variables(script) == {"B": "after"}


def test_sourced_files_are_noted():
    assert read_script(". ./env.sh").notes == [
        "line 1: '. ./env.sh' is not read; the variables it sets count as unset"
    ]


# -------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("A='never closed\n", "line 1: a ' quote is never closed"),
        ('B=1\nA="never closed\n', 'line 2: a " quote is never closed'),
        ("A=`never closed", "line 1: a ` quote is never closed"),
        ("A=$(date", "line 1: a '(' is never closed by ')'"),
        ("A=${B", "line 1: a '{' is never closed by '}'"),
    ],
)
def test_scripts_that_cannot_be_read(script, message):
    with pytest.raises(ConvertError) as error:
        read_script(script)
    assert str(error.value) == message


# ------------------------------------------------------------------------------ arrays


def test_a_command_launched_through_an_array():
    script = read_script(
        'CMD=(python3 -u)\nDATA=(data.a=1 "data.b=two words")\n'
        '"${CMD[@]}" -m verl.trainer.main_ppo "${DATA[@]}" trainer.x=1\n'
    )
    (command,) = script.commands
    assert [w.text for w in command.words] == [
        "python3",
        "-u",
        "-m",
        "verl.trainer.main_ppo",
        "data.a=1",
        "data.b=two words",
        "trainer.x=1",
    ]
    assert [w.line for w in command.words][4:] == [2, 2, 3]  # where each element was written
    assert script.variables["CMD"] == "python3"  # $CMD of an array is its first element


def test_an_array_over_lines_with_comments_holding_quotes_and_parentheses():
    text = (
        "ARGS=(\n"
        "    a=1  # the model's path (a local folder)\n"
        "    # b=2 isn't used (yet)\n"
        '    c="$X"\n'
        ")\n"
        "ARGS+=(d=4)\n"
        "run ${ARGS[@]} ${ARGS[0]} ${#ARGS[@]}\n"
    )
    command = read_script(text, {"X": "3"}).commands[0]
    assert [w.text for w in command.words] == ["run", "a=1", "c=3", "d=4", "a=1", "${#ARGS[@]}"]
    assert command.words[-1].unresolved == ("${#ARGS[@]} is not an expansion evaluated here",)


def test_an_array_set_under_an_undecided_condition_is_unresolved():
    script = read_script('for i in 1 2; do\n  A=(x=$i)\ndone\nrun "${A[@]}"\n')
    (word,) = script.commands[-1].words[1:]
    assert word.unresolved == (
        "$A is set in a loop or under a condition that cannot be decided here (line 2)",
    )


def test_an_array_that_holds_the_scripts_arguments_passes_them_on():
    script = read_script('ARGS=(a=1 "$@")\nrun "${ARGS[@]}"\n')
    assert script.commands[0].passes_arguments
    assert [w.text for w in script.commands[0].words] == ["run", "a=1"]


def test_an_array_never_closed_is_an_error():
    with pytest.raises(ConvertError, match=r"^line 1: an array's '\(' is never closed by '\)'$"):
        read_script("A=(a b\n")


# ----------------------------------------------------- the script's arguments, environment


def test_an_argument_with_a_default_takes_the_default():
    script = read_script('ENGINE=${1:-vllm}\nN=${2-8}\nrun "${@:2}"\n')
    assert script.variables == {"ENGINE": "vllm", "N": "8"}
    assert script.notes == [
        "${1:-vllm} is read as its default, 'vllm', as when the script is run without arguments",
        "${2-8} is read as its default, '8', as when the script is run without arguments",
    ]
    assert script.commands[0].passes_arguments  # "${@:2}" passes some of them on


def test_inherited_variables_are_read_and_named():
    script = read_script(
        'MODEL=$HOME/models/qwen\nOUT="$(pwd)/out"\nUSER=me\nWHO=$USER\n',
        env={"PWD": "/given"},
        inherited={"HOME": "/home/a", "PWD": "/here", "USER": "a"},
    )
    assert script.variables["MODEL"] == "/home/a/models/qwen"
    assert script.variables["OUT"] == "/given/out"  # --env outranks the environment
    assert script.variables["WHO"] == "me"
    assert script.inherited == {"HOME": "/home/a"}  # the script set USER itself


# ------------------------------------------------------------------ case


DEVICE_CASE = """\
DEVICE=${DEVICE:-gpu}
case "${DEVICE}" in
    gpu)
        N=8
        ;;
    npu|ascend)
        N=16 ;;
    *)
        echo "unsupported" >&2; exit 1 ;;
esac
"""


@pytest.mark.parametrize(
    ("env", "value", "branch"),
    [({}, "8", "gpu) of line 3"), ({"DEVICE": "ascend"}, "16", "npu|ascend) of line 6")],
)
def test_case_takes_the_branch_its_word_matches(env, value, branch):
    result = read_script(DEVICE_CASE, env)
    assert result.variables["N"] == value
    device = env.get("DEVICE", "gpu")
    assert f'line 2: case "${{DEVICE}}" is {device!r}: the branch {branch} is taken' in (
        result.notes
    )


def test_case_patterns_are_globs_and_the_first_match_wins():
    script = (
        'M=dppo_kl\ncase $M in\n  dppo_*) C=0.1 ;;\n  dppo_kl) C=0.2 ;;\n  "*") C=0.3 ;;\nesac\n'
    )
    assert variables(script)["C"] == "0.1"
    assert "C" not in variables(script.replace("M=dppo_kl", "M=x"))  # "*" matches only *
    assert variables(script.replace("M=dppo_kl", "M='*'"))["C"] == "0.3"


def test_case_of_an_unknown_word_leaves_its_branches_unresolved():
    result = read_script("case $MODE in\n  a) X=1 ;;\n  b) X=2 ;;\nesac\necho $X\n")
    assert isinstance(result.variables["X"], Unresolved)
    assert (
        "line 1: case $MODE: $MODE is not set in the script; the branches' settings count as "
        "unresolved (give --env MODE=VALUE to choose one)"
    ) in result.notes


def test_case_inside_an_if_and_an_if_inside_a_case():
    script = """\
S=megatron
if [ "${USE:-1}" != 0 ]; then
    case "${S}" in
        megatron) E=megatron ;;
        *)        E=fsdp ;;
    esac
fi
case "$S" in
    megatron)
        if [ "$E" = megatron ]; then T=2; else T=1; fi
        ;;
esac
"""
    assert variables(script)["E"] == "megatron"
    assert variables(script)["T"] == "2"
    assert variables(script, {"USE": "0"}).get("E") is None


def test_integer_tests_and_decided_conditions_are_noted():
    result = read_script('SP=${SP:-2}\nif [ "$SP" -gt 1 ]; then P=yes; else P=no; fi\n')
    assert result.variables["P"] == "yes"
    assert 'line 2: if [ "$SP" -gt 1 ] is true' in result.notes
    assert variables('if [ "$X" -gt 1 ]; then P=yes; fi\n').get("P") != "yes"


def test_case_conversion_and_path_commands():
    script = 'M=Org/Model-7B\nN="$(basename "${M,,}")-$(dirname /a/b/c.sh)-${M^^}"\n'
    assert variables(script)["N"] == "model-7b-/a/b-ORG/MODEL-7B"


def test_env_stands_for_what_a_command_would_set():
    script = 'device_name=$(python3 -c "print(1)")\nif [ "$device_name" = cuda ]; then X=1; fi\n'
    assert isinstance(variables(script)["device_name"], Unresolved)
    result = read_script(script, {"device_name": "cuda"})
    assert result.variables["X"] == "1"
    assert any(note.startswith("line 1: $device_name is set by something") for note in result.notes)


def test_an_unresolved_value_shows_as_far_as_it_expands():
    found = variables(
        'ROOT=$(cd "$(dirname "$0")" && pwd)\nDATA=$RAY_DATA_HOME/data\nFILE="${DATA}/a.parquet"\n'
        "TAG=run_$(date +%s)\nF2=$ROOT/b.py"
    )
    assert found["FILE"].shown == "$RAY_DATA_HOME/data/a.parquet"
    assert found["TAG"].shown == "run_$(date +%s)"
    # a variable that is only a command that is not run shows as its name
    assert found["F2"].shown == "$ROOT/b.py"
