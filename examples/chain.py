"""Drop ChatGravity into an existing LangChain chain: prompt | model | parser.

Run: python examples/chain.py
"""

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate

from agent_gravity import ChatGravity

prompt = ChatPromptTemplate.from_messages([
    ("system", "You answer arithmetic word problems with a number."),
    ("user", "{question}"),
])
chain = prompt | ChatGravity() | StrOutputParser()


def main() -> None:
    questions = ["Sara has 12 cookies and eats 4. How many are left?",
                 "Tom has 3 apples and buys 5 more. How many apples does he have?"]
    for question, answer in zip(questions, chain.batch([{"question": q} for q in questions])):
        print(f"{question} -> {answer}")


if __name__ == "__main__":
    main()
