"""What every task shares: the sample, the task record and its registry, token-exact assembly.

A task is data plus a scoring rule (docs/DESIGN: lm-eval's habit): a *builder* that turns a
seeded ``random.Random``, the model's tokenizer, a length and a depth into the parts of a prompt,
and a *metric* that scores the model's output against the sample's references. The prompt is
built in token space — every piece encoded on its own and the ids concatenated, as
:func:`posenc.extend.measures.perplexity.passkey_prompt` does — so it is exactly ``length`` ids for that
tokenizer, the padding or trimming done by the haystack. (RULER instead searches for the
largest haystack whose *text* fits ``max_seq_length - tokens_to_generate``, so its prompts are up
to a sentence shorter than asked, and their ids are the joined text's.) ``Sample.text`` is the
ids decoded; re-encoding it can give other ids where pieces meet, so a sample's ids, not its
text, are what the model reads.

Depth follows RULER's: the fraction of the *haystack* (needles left out) before the needle, so
depth 0 is the first thing after the instruction and depth 1 the last before the question.
The answer's needle is inserted at exactly ``round(depth * haystack_tokens)`` haystack tokens,
on a sentence (unit) boundary: the haystack window is chosen so that a boundary falls there
(:func:`window`), never cutting a sentence around the needle; it may start and end mid-sentence.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "TASKS", "Encoder", "Group", "Parts", "Question", "Sample", "Span", "Stream", "Task", "get_task", "insert",
    "register", "task_names", "window",
]  # fmt: skip


@dataclass(frozen=True)
class Span:
    """Ids ``[start, end)`` of the prompt holding one inserted needle (or chain link);
    ``answer``: it carries a reference (the others are distractors or other links)."""

    start: int
    end: int
    answer: bool


@dataclass(frozen=True)
class Sample:
    """One prompt of a task, exactly ``length`` ids, and what scores the model's answer.

    ``ids``: the prompt (BOS where the tokenizer has one, instruction, context, question,
    answer prefix) as a tuple of ``length`` ints; ``text``: those ids decoded; ``references``:
    the strings the output must contain; ``target``: the reference continuation whose
    teacher-forced log-probability is measured (``" 1234567"``); ``context``: the ``[start,
    end)`` ids of haystack and needles; ``needles``: every inserted needle's span, the first
    the one at ``depth`` (the first reference's; the chain's first link), the others as drawn;
    ``depth``: as asked (None for tasks without one); ``seed``/``index``: which sample;
    ``prefix``: the first ``prefix`` ids are a context shared with the other questions of its
    group (:meth:`Task.samples` with ``questions`` > 1: prefilled once, then each question's
    suffix after it), 0 for a prompt asked alone. A grouped prompt is at most ``length`` ids
    (its group's longest question exactly ``length``)."""

    task: str
    seed: int
    index: int
    length: int
    depth: float | None
    ids: tuple[int, ...]
    text: str
    references: tuple[str, ...]
    target: str
    answer_prefix: str
    max_new_tokens: int
    context: tuple[int, int]
    needles: tuple[Span, ...] = ()
    prefix: int = 0

    def identity(self) -> dict[str, Any]:
        """What names the sample in a row: the same for every method, so methods pair on it."""
        return {"task": self.task, "seed": self.seed, "index": self.index,
                "length": self.length, "depth": self.depth}  # fmt: skip


@dataclass(frozen=True)
class Parts:
    """A builder's prompt in pieces (ids): ``head`` (instruction, few-shot example), ``context``
    with ``needles`` spans relative to it, ``tail`` (question and answer prefix)."""

    head: list[int]
    context: list[int]
    tail: list[int]
    references: tuple[str, ...]
    target: str
    answer_prefix: str
    needles: tuple[Span, ...] = ()


@dataclass(frozen=True)
class Question:
    """One question of a shared context (:class:`Group`): its ``tail`` ids (question and answer
    prefix), what scores it, and the needle spans relative to the context, its own first."""

    tail: list[int]
    references: tuple[str, ...]
    target: str
    answer_prefix: str
    needles: tuple[Span, ...]


@dataclass(frozen=True)
class Group:
    """A group builder's prompts in pieces: one ``head`` and ``context`` (every question's
    needles planted in it) and the ``questions`` asked of it, each alone."""

    head: list[int]
    context: list[int]
    questions: tuple[Question, ...]


#: A builder: ``(rng, encoder, length, depth) -> Parts`` whose ids add up to ``length`` (BOS
#: aside: :meth:`Encoder.room` counts it).
Builder = Callable[[random.Random, "Encoder", int, "float | None"], Parts]
#: A group builder: ``(rng, encoder, length, depth, k) -> Group`` of ``k`` questions, BOS, head,
#: context and the longest question's tail adding up to ``length``.
GroupBuilder = Callable[[random.Random, "Encoder", int, "float | None", int], Group]
#: A metric: ``(output text, references) -> score in [0, 1]``.
Metric = Callable[[str, Sequence[str]], float]


class Encoder:
    """The model's tokenizer as pieces of a prompt need it: ``ids(text)`` without special tokens
    (memoized: the same sentence is encoded once), its BOS, and the room left for a context."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        bos = getattr(tokenizer, "bos_token_id", None)
        self.bos: list[int] = [int(bos)] if bos is not None else []
        self._memo: dict[str, tuple[int, ...]] = {}

    def ids(self, text: str) -> list[int]:
        """``text`` -> its ids (no BOS, no EOS)."""
        got = self._memo.get(text)
        if got is None:
            got = tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(self._memo) < 200_000:  # a bound: distractor needles are all distinct
                self._memo[text] = got
        return list(got)

    def many(self, texts: Sequence[str]) -> list[list[int]]:
        """Each of ``texts`` encoded (one batched call for those not seen yet)."""
        todo = [t for t in dict.fromkeys(texts) if t not in self._memo]
        if todo:
            batch = self.tokenizer(todo, add_special_tokens=False)["input_ids"]
            for text, ids in zip(todo, batch, strict=True):
                self._memo[text] = tuple(ids)
        return [list(self._memo[t]) if t in self._memo else self.ids(t) for t in texts]

    def room(self, length: int, *pieces: Sequence[int]) -> int:
        """Tokens left for a context in a ``length``-token prompt around ``pieces`` (BOS
        counted); ValueError naming the shortest length possible when none are."""
        fixed = len(self.bos) + sum(len(p) for p in pieces)
        if fixed > length:
            raise ValueError(f"a prompt of {length} tokens is too short for this task: its "
                             f"instruction, question and needles alone take {fixed}")  # fmt: skip
        return length - fixed

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids)))


_ENCODERS: weakref.WeakKeyDictionary[Any, Encoder] = weakref.WeakKeyDictionary()


def encoder_for(tokenizer: Any) -> Encoder:
    """One :class:`Encoder` per live tokenizer (its memo shared by every sample)."""
    try:
        enc = _ENCODERS.get(tokenizer)
        if enc is None:
            enc = _ENCODERS[tokenizer] = Encoder(tokenizer)
        return enc
    except TypeError:  # not weak-referenceable: a fresh memo
        return Encoder(tokenizer)


# --- haystacks ----------------------------------------------------------------------------------


@dataclass
class Stream:
    """A haystack as a stream of ids in units (sentences, lines), ``starts[i]`` the id index
    where unit ``i`` begins; ``more(rng)`` gives the next unit's ids (None: it ends)."""

    more: Callable[[], list[int] | None]
    ids: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)

    def grow(self, tokens: int) -> None:
        """Units appended until the stream holds at least ``tokens`` ids (or ends)."""
        while len(self.ids) < tokens:
            unit = self.more()
            if not unit:
                return
            self.starts.append(len(self.ids))
            self.ids.extend(unit)


def window(stream: Stream, n: int, at: int) -> tuple[list[int], list[int]]:
    """``n`` ids of ``stream`` with a unit boundary exactly ``at`` ids in, and the boundaries
    inside it: ``(ids, boundaries)``, ``boundaries`` ascending offsets in ``[0, n]`` that include
    ``at``. The window starts at ``b - at`` for the first boundary ``b >= at`` (a sentence of the
    stream at most cut at the window's two ends). A stream too short is ValueError."""
    stream.grow(at + 1)
    b = next((s for s in stream.starts if s >= at), None)
    if b is None:  # the stream ended before `at`: no boundary there (an empty haystack aside)
        b = len(stream.ids)
    stream.grow(b - at + n)
    if len(stream.ids) < b - at + n:
        raise ValueError(f"the haystack holds {len(stream.ids)} tokens, fewer than {n} asked")
    lo = b - at
    inner = [s - lo for s in stream.starts if lo <= s <= lo + n]
    return stream.ids[lo : lo + n], sorted({*inner, at})


def insert(haystack: list[int], needles: Sequence[tuple[int, list[int], bool]]) -> tuple[
    list[int], tuple[Span, ...]
]:  # fmt: skip
    """``haystack`` with each needle ``(offset, ids, answer)`` inserted before the haystack id at
    ``offset`` (needles at one offset in the order given), and their spans in the result, in
    the order the needles were given (the first: the one a builder put at the depth)."""
    order = sorted(range(len(needles)), key=lambda i: needles[i][0])  # stable: order kept
    out: list[int] = []
    spans: dict[int, Span] = {}
    done = 0
    for i in order:
        offset, ids, answer = needles[i]
        out += haystack[done:offset]
        done = offset
        spans[i] = Span(len(out), len(out) + len(ids), answer)
        out += ids
    return out + haystack[done:], tuple(spans[i] for i in range(len(needles)))


def spread(rng: random.Random, boundaries: Sequence[int], k: int, exclude: int) -> list[int]:
    """``k`` distinct boundaries drawn from ``boundaries`` other than ``exclude`` (RULER draws
    its needles' depths without replacement), with replacement when there are too few."""
    pool = [b for b in boundaries if b != exclude] or [exclude]
    return rng.sample(pool, k) if k <= len(pool) else [rng.choice(pool) for _ in range(k)]


# --- the task record and its registry -----------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """A task by name: its builder, metric (``metric_name``: RULER's name for it), the new
    tokens the model may write (RULER's ``tokens_to_generate``), whether it takes a depth, and
    ``follows``: the RULER configuration and files it reproduces."""

    name: str
    family: str
    build: Builder
    metric: Metric
    metric_name: str
    max_new_tokens: int
    uses_depth: bool
    follows: str
    group: GroupBuilder | None = None  # several questions of one context (None: one only)

    def sample(self, tokenizer: Any, length: int, depth: float | None, seed: int,
               index: int = 0) -> Sample:  # fmt: skip
        """The ``index``-th sample of ``seed`` at ``length`` tokens and ``depth`` (None for a
        task without depth; in ``[0, 1]`` for one with): the same ids for the same arguments
        and tokenizer, on any machine (the random draws are seeded by the arguments' text)."""
        depth = self._check_depth(depth)
        rng = random.Random(f"{self.name}|{seed}|{length}|{depth}|{index}")
        enc = encoder_for(tokenizer)
        parts = self.build(rng, enc, length, depth)
        ids = enc.bos + parts.head + parts.context + parts.tail
        if len(ids) != length:  # a builder's bug, never the user's
            raise AssertionError(f"task {self.name} built {len(ids)} tokens, not {length}")
        start = len(enc.bos) + len(parts.head)
        needles = tuple(Span(s.start + start, s.end + start, s.answer) for s in parts.needles)
        return Sample(
            self.name, seed, index, length, depth, tuple(ids), enc.decode(ids),
            parts.references, parts.target, parts.answer_prefix, self.max_new_tokens,
            (start, start + len(parts.context)), needles,
        )  # fmt: skip

    def samples(self, tokenizer: Any, length: int, depth: float | None, n: int,
                seed: int, questions: int = 1) -> list[Sample]:  # fmt: skip
        """Samples ``0 .. n - 1`` of ``seed`` (:meth:`sample`): every method reads these.
        ``questions`` > 1: ``n / questions`` contexts of ``questions`` questions each
        (:meth:`context`), sample ``i`` question ``i % questions`` of context
        ``i // questions``."""
        if questions == 1:
            return [self.sample(tokenizer, length, depth, seed, i) for i in range(n)]
        check_questions(self, n, questions)
        return [s for c in range(n // questions)
                for s in self.context(tokenizer, length, depth, seed, c, questions)]  # fmt: skip

    def context(self, tokenizer: Any, length: int, depth: float | None, seed: int, index: int,
                questions: int) -> list[Sample]:  # fmt: skip
        """The ``questions`` samples of context ``index``: one prompt per question, each the
        shared ids (BOS, head, context with every question's needles) then its own tail
        (``Sample.prefix`` the shared length); the same ids for the same arguments."""
        depth = self._check_depth(depth)
        check_questions(self, questions, questions)
        rng = random.Random(f"{self.name}|{seed}|{length}|{depth}|context {index}|{questions}")
        enc = encoder_for(tokenizer)
        assert self.group is not None  # check_questions
        group = self.group(rng, enc, length, depth, questions)
        shared = enc.bos + group.head + group.context
        if len(shared) + max(len(q.tail) for q in group.questions) != length:  # a builder's bug
            raise AssertionError(f"task {self.name} built a group longer or shorter than {length}")
        start = len(enc.bos) + len(group.head)
        out = []
        for j, q in enumerate(group.questions):
            ids = shared + q.tail
            needles = tuple(Span(s.start + start, s.end + start, s.answer) for s in q.needles)
            out.append(Sample(
                self.name, seed, index * questions + j, length, depth, tuple(ids),
                enc.decode(ids), q.references, q.target, q.answer_prefix, self.max_new_tokens,
                (start, start + len(group.context)), needles, len(shared),
            ))  # fmt: skip
        return out

    def score(self, output: str, sample: Sample) -> float:
        """``output`` (the model's text after the answer prefix) scored in ``[0, 1]``."""
        return self.metric(output, sample.references)

    def _check_depth(self, depth: float | None) -> float | None:
        if not self.uses_depth:
            if depth is not None:
                raise ValueError(f"task {self.name} has no depth; pass None, got {depth}")
            return None
        if depth is None or not 0.0 <= float(depth) <= 1.0:
            raise ValueError(f"task {self.name} needs a depth in [0, 1], got {depth}")
        return float(depth)


def check_questions(task: Task, n: int, questions: int) -> None:
    """``questions`` per context fits ``task`` and ``n`` samples: one line saying what does."""
    if isinstance(questions, bool) or not isinstance(questions, int) or questions < 1:
        raise ValueError(f"questions per context must be a whole number >= 1, got {questions!r}")
    if questions > 1 and task.group is None:
        grouped = ", ".join(t.name for t in TASKS.values() if t.group is not None)
        raise ValueError(f"task {task.name} asks one question of a context; --questions-per-"
                         f"context above 1 is for {grouped}")  # fmt: skip
    if n % questions:
        raise ValueError(
            f"{n} samples are not a whole number of contexts of {questions} "
            "questions: make --samples a multiple of --questions-per-context"
        )


TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Add ``task`` to :data:`TASKS` under its name (a second task of one name is an error)."""
    if task.name in TASKS:
        raise ValueError(f"a task named {task.name!r} is registered already")
    TASKS[task.name] = task
    return task


def get_task(name: str) -> Task:
    """The task registered as ``name``; one line naming those there are otherwise."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; tasks: {', '.join(TASKS)}") from None


def task_names() -> tuple[str, ...]:
    """Every registered task, in registration order (RULER's order)."""
    return tuple(TASKS)
