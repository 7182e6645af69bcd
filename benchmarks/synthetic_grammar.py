"""A small English-like grammar, so that generation quality can be measured on a model trained in minutes.

A tiny BiGLM trained for a few hundred steps on real text stays near the unigram plateau and writes
"the the ." whatever the decoding; on this grammar it learns the structure, and a decode can be
checked against the grammar itself, not only scored by the model that wrote it.

Each document picks one subject and writes 4-10 sentences ``<Subject> <verb> <object> <tail>.``, so
an answer must copy the subject from its prompt (long-range context through the prefix cache) and
keep the sentence structure across block boundaries.

    python benchmarks/synthetic_grammar.py OUT.txt [--docs 20000] [--seed 0]   # documents, blank-line separated
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from pathlib import Path

SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the teacher", "a small bird", "the farmer", "our baker",
            "the young queen", "a tired horse", "the captain", "my brother"]
VERBS = ["sees", "likes", "follows", "finds", "remembers", "paints", "crosses", "visits", "watches", "cleans",
         "leaves", "guards"]
OBJECTS = ["the garden", "a red house", "the long road", "a quiet lake", "the market", "an open window", "the bridge",
           "a green field", "the old mill", "a busy street", "the tall tower", "a wooden boat"]
TAILS = ["in the morning", "after the rain", "every day", "with great care", "before dinner", "at night",
         "in the summer", "without a word", "once again", "near the sea"]
_SENTENCE = re.compile("^({})\\s+({})\\s+({})\\s+({})$".format(*("|".join(map(re.escape, words)) for words in
                                                              (SUBJECTS, VERBS, OBJECTS, TAILS))), re.IGNORECASE)


def documents(n: int, *, seed: int = 0) -> list[str]:
    """``n`` documents, each one subject throughout."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        subject = rng.choice(SUBJECTS)
        docs.append(" ".join(f"{subject.capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}."
                             for _ in range(rng.randint(4, 10))))
    return docs


def check(prompt: str, answer: str) -> dict[str, int]:
    """Complete sentences of ``answer`` (a trailing fragment cut by the length limit is left out), how many
    follow the grammar, and how many of those keep the prompt's subject."""
    subject = next((s for s in SUBJECTS if prompt.lower().lstrip().startswith(s)), None)
    parts = answer.split(".")
    complete = [p.strip() for p in parts[:-1]]  # the part after the last full stop is unfinished
    # the answer may start inside the prompt's last sentence: its first part completes that sentence
    if complete and not prompt.rstrip().endswith("."):
        complete = complete[1:]
    good = [m for m in (_SENTENCE.match(c) for c in complete) if m]
    return dict(sentences=len(complete), grammatical=len(good),
                on_subject=sum(m.group(1).lower() == subject for m in good) if subject else 0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--docs", type=int, default=20000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n\n".join(documents(args.docs, seed=args.seed)) + "\n")
    print(f"wrote {args.docs} documents to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
