import pytest

from agent_gravity._config import ReasoningFormat
from agent_gravity._reasoning import ReasoningSplitter, scaffold, split_reasoning

FMT = ReasoningFormat()
OUTPUT = "Tom has 3.\nSo 3 + 5 = 8.\n</think>\nAnswer: 8 apples."


def test_split_whole_output():
    assert split_reasoning(OUTPUT, FMT) == ("Tom has 3.\nSo 3 + 5 = 8.", "8 apples.")


def test_output_without_marker_is_all_reasoning():
    assert split_reasoning("still thinking", FMT) == ("still thinking", "")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7])
def test_streaming_in_any_chunking_gives_the_same_split(size):
    splitter = ReasoningSplitter(FMT)
    reasoning, answer = "", ""
    for i in range(0, len(OUTPUT), size):
        r, a = splitter.feed(OUTPUT[i:i + size])
        assert "<" not in r and "Answer" not in a  # no partial marker ever leaks out
        reasoning, answer = reasoning + r, answer + a
    r, a = splitter.close()
    assert (reasoning + r).strip() == "Tom has 3.\nSo 3 + 5 = 8."
    assert answer + a == "8 apples."


def test_scaffold_adds_instruction_and_example_and_prefills_the_start():
    messages, prefill = scaffold([{"role": "user", "content": "Q?"}], FMT)
    assert prefill == "<think>\n"
    assert messages[0]["role"] == "system" and "</think>" in messages[0]["content"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"].startswith("<think>\n") and "</think>\nAnswer: 7" in messages[2]["content"]
    assert messages[-1] == {"role": "user", "content": "Q?"}


def test_scaffold_keeps_the_users_system_message():
    messages, _ = scaffold([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Q?"}], FMT)
    assert messages[0]["content"].startswith("Be terse.")
    assert sum(m["role"] == "system" for m in messages) == 1


def test_native_format_is_not_scaffolded():
    native = ReasoningFormat(scaffold=False, answer_prefix="\n\n")
    messages, prefill = scaffold([{"role": "user", "content": "Q?"}], native)
    assert messages == [{"role": "user", "content": "Q?"}] and prefill == "<think>\n"
