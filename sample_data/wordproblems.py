"""Seeded grade-school word problems in GSM8K's shape, with MATH-shaped twins.

The second sample world: a problem is a few sentences (shopping, baking, clips sold to
friends, travel, savings, classrooms, gardens...) whose answer takes two to four exact
integer operations on small numbers (every intermediate result is at most 200), so a
tiny model can learn the arithmetic and still slip. Each problem carries

- ``question`` / ``answer``: GSM8K's columns; the answer is reasoning lines (no calculator
  annotations) ending in ``#### 72``;
- ``problem`` / ``solution`` / ``level`` / ``type``: MATH's columns; the solution ends in
  ``\\boxed{72}`` and the level is ``Level {operations - 1}``;
- ``completion``: what the chat policy is trained to write, one line per operation:
  ``<think>\\n48 / 2 = 24\\n48 + 24 = 72\\n</think>\\n\\boxed{72}``;
- ``steps`` ([a, op, b, result] per operation) and ``final``, to check the arithmetic.

``python -m sample_data.wordproblems`` writes ``sample_data/wordproblems/`` (GSM8K JSONL and
MATH Parquet, train and test, disjoint by question text).
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "wordproblems"
N_TRAIN, N_TEST = 2000, 300
TRAIN_SEED, TEST_SEED = 1, 2

NAMES = [("Natalia", "she", "her"), ("Tom", "he", "his"), ("Aisha", "she", "her"), ("Carlos", "he", "his"),
         ("Mei", "she", "her"), ("Omar", "he", "his"), ("Priya", "she", "her"), ("Liam", "he", "his"),
         ("Sofia", "she", "her"), ("Kenji", "he", "his"), ("Grace", "she", "her"), ("Mateo", "he", "his"),
         ("Fatima", "she", "her"), ("Ben", "he", "his"), ("Chloe", "she", "her"), ("Yusuf", "he", "his"),
         ("Hannah", "she", "her"), ("Diego", "he", "his"), ("Lena", "she", "her"), ("Noah", "he", "his"),
         ("Rosa", "she", "her"), ("Ivan", "he", "his"), ("Zara", "she", "her"), ("Eli", "he", "his")]
FRACTIONS = {2: "half", 3: "a third", 4: "a quarter"}
OPS = {"+": "+", "-": "-", "*": "\\times", "/": "\\div"}
LIMIT = 200


def apply(a: int, op: str, b: int) -> int:
    """The exact integer result of ``a op b`` (division must leave no remainder)."""
    if op == "/":
        assert b and a % b == 0, (a, b)
        return a // b
    return {"+": a + b, "-": a - b, "*": a * b}[op]


@dataclass(frozen=True)
class Step:
    """One operation and the GSM8K sentence that states it (``{}`` marks the equation)."""

    a: int
    op: str
    b: int
    says: str

    @property
    def result(self) -> int:
        return apply(self.a, self.op, self.b)

    def equation(self, latex: bool = False) -> str:
        op = OPS[self.op] if latex else self.op
        return f"{self.a} {op} {self.b} = {self.result}"


@dataclass(frozen=True)
class Person:
    name: str
    he: str
    his: str


Story = tuple[list[str], str, list[Step]]  # facts, question sentence, operations


def _person(rng: random.Random, avoid: str = "") -> Person:
    return Person(*rng.choice([n for n in NAMES if n[0] != avoid]))


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


def _clips(rng: random.Random) -> Story:
    p, d = _person(rng), rng.choice([2, 3, 4])
    item = rng.choice(["clips", "bracelets", "cupcakes", "stickers", "candles"])
    may = rng.randint(3, 20)
    april = may * d
    facts = [f"{p.name} sold {item} to {rng.randint(8, 48)} of {p.his} friends in April, {april} {item} in all.",
             f"In May {p.he} sold {FRACTIONS[d]} as many {item} as in April."]
    steps = [Step(april, "/", d, f"In May {p.name} sold {{}} {item}."),
             Step(april, "+", may, f"Altogether {p.he} sold {{}} {item} in April and May.")]
    if rng.random() < 0.5:
        more = rng.randint(2, 15)
        facts.append(f"In June {p.he} sold {more} more {item} than in May.")
        steps = steps[:1] + [Step(may, "+", more, f"In June {p.he} sold {{}} {item}."),
                             Step(april, "+", may, f"April and May make {{}} {item}."),
                             Step(april + may, "+", may + more, f"Over the three months {p.he} sold {{}} {item}.")]
        if april + may + may + more > LIMIT:
            return _clips(rng)
        return facts, f"How many {item} did {p.name} sell in April, May and June?", steps
    return facts, f"How many {item} did {p.name} sell altogether in April and May?", steps


def _shopping(rng: random.Random) -> Story:
    p = _person(rng)
    (x, xs), (y, ys) = rng.sample([("notebook", "notebooks"), ("pen", "pens"), ("apple", "apples"),
                                   ("toy car", "toy cars"), ("comic", "comics"), ("ribbon", "ribbons")], 2)
    na, pa, nb, pb = rng.randint(2, 9), rng.randint(2, 12), rng.randint(2, 9), rng.randint(1, 9)
    facts = [f"{p.name} buys {na} {xs} for ${pa} each.", f"{_cap(p.he)} also buys {nb} {ys} that cost ${pb} each."]
    if rng.random() < 0.3:
        facts = [f"{p.name} buys {nb} {ys} at ${pb} each and {na} {xs} at ${pa} each."]
    steps = [Step(na, "*", pa, f"The {xs} cost {{}} dollars."),
             Step(nb, "*", pb, f"The {ys} cost {{}} dollars."),
             Step(na * pa, "+", nb * pb, "In total that is {} dollars.")]
    total = na * pa + nb * pb
    if total > LIMIT:
        return _shopping(rng)
    if rng.random() < 0.5:
        bill = next(b for b in (20, 50, 100, 200) if b >= total)
        facts.append(f"{_cap(p.he)} pays with a ${bill} bill.")
        return facts, f"How much change does {p.name} get?", steps + [Step(bill, "-", total, "The change is {} dollars.")]
    return facts, f"How much does {p.name} spend in all?", steps


def _baking(rng: random.Random) -> Story:
    p = _person(rng)
    item = rng.choice(["cookies", "muffins", "brownies", "buns", "tarts"])
    trays, per = rng.randint(2, 8), rng.randint(3, 12)
    made = trays * per
    eaten = rng.randint(1, min(made - 1, 20))
    facts = [f"{p.name} bakes {trays} trays of {item} with {per} {item} on each tray.",
             f"{_cap(p.his)} family eats {eaten} of them."]
    steps = [Step(trays, "*", per, f"{p.name} bakes {{}} {item}."),
             Step(made, "-", eaten, f"After the family eats, {{}} {item} are left.")]
    left = made - eaten
    friends = [f for f in range(2, 9) if left % f == 0]
    if friends and rng.random() < 0.6:
        f = rng.choice(friends)
        facts.append(f"{_cap(p.he)} shares the rest equally among {f} friends.")
        return facts, f"How many {item} does each friend get?", steps + [Step(left, "/", f, "Each friend gets {} " + item + ".")]
    return facts, f"How many {item} are left?", steps


def _savings(rng: random.Random) -> Story:
    p = _person(rng)
    start, weekly, weeks = rng.randint(5, 60), rng.randint(2, 15), rng.randint(2, 9)
    saved = weekly * weeks
    total = start + saved
    if total > LIMIT:
        return _savings(rng)
    facts = [f"{p.name} has ${start} in a piggy bank.", f"{_cap(p.he)} saves ${weekly} every week for {weeks} weeks."]
    if rng.random() < 0.3:
        facts = [f"{p.name} saves ${weekly} every week for {weeks} weeks.",
                 f"{_cap(p.he)} already had ${start} in a piggy bank."]
    steps = [Step(weekly, "*", weeks, f"{_cap(p.he)} saves {{}} dollars."),
             Step(start, "+", saved, f"{_cap(p.he)} then has {{}} dollars.")]
    if rng.random() < 0.6:
        gift = rng.choice(["a bike helmet", "a board game", "a jacket", "a lamp", "a book"])
        cost = rng.randint(1, total)
        facts.append(f"Then {p.he} buys {gift} for ${cost}.")
        return facts, f"How much money does {p.name} have left?", steps + [Step(total, "-", cost, "{} dollars are left.")]
    return facts, f"How much money does {p.name} have now?", steps


def _travel(rng: random.Random) -> Story:
    p = _person(rng)
    vehicle = rng.choice(["drives", "rides a bike", "takes a bus", "sails"])
    speed, hours = rng.randint(5, 40), rng.randint(2, 5)
    dist = speed * hours
    if dist > LIMIT:
        return _travel(rng)
    extra = rng.randint(3, 40)
    facts = [f"{p.name} {vehicle} at {speed} miles per hour for {hours} hours.",
             f"Then {p.he} goes another {extra} miles."]
    steps = [Step(speed, "*", hours, "In the first part " + p.he + " covers {} miles."),
             Step(dist, "+", extra, "So far " + p.he + " has gone {} miles.")]
    gone = dist + extra
    if gone >= LIMIT:
        return _travel(rng)
    if rng.random() < 0.6:
        trip = rng.randint(gone + 1, LIMIT)
        facts.insert(0, f"{p.name} is on a {trip}-mile trip.")
        return facts, "How many miles are left?", steps + [Step(trip, "-", gone, "{} miles are left.")]
    return facts, f"How many miles does {p.name} travel in all?", steps


def _classroom(rng: random.Random) -> Story:
    classes, size = rng.randint(2, 6), rng.randint(12, 30)
    students = classes * size
    if students > LIMIT:
        return _classroom(rng)
    boys = rng.randint(5, students - 5)
    facts = [f"A school has {classes} classes with {size} students in each class.", f"{boys} of the students are boys."]
    steps = [Step(classes, "*", size, "The school has {} students."),
             Step(students, "-", boys, "{} of them are girls.")]
    girls = students - boys
    teams = [t for t in range(2, 9) if girls % t == 0]
    if teams and rng.random() < 0.6:
        t = rng.choice(teams)
        facts.append(f"The girls form teams of {t} for a relay race.")
        return facts, "How many teams do the girls form?", steps + [Step(girls, "/", t, "They form {} teams.")]
    return facts, "How many girls are in the school?", steps


def _garden(rng: random.Random) -> Story:
    p = _person(rng)
    plant = rng.choice(["tomato plants", "rose bushes", "sunflowers", "pepper plants", "tulips"])
    rows, per = rng.randint(2, 9), rng.randint(3, 15)
    total = rows * per
    if total > LIMIT:
        return _garden(rng)
    dead = rng.randint(1, total - 1)
    new = rng.randint(2, 30)
    facts = [f"{p.name}'s garden has {rows} rows of {plant} with {per} in each row.",
             f"A storm kills {dead} of them.", f"{_cap(p.he)} plants {new} new ones."]
    steps = [Step(rows, "*", per, "The garden had {} " + plant + "."),
             Step(total, "-", dead, "After the storm {} were left."),
             Step(total - dead, "+", new, "Now there are {} " + plant + ".")]
    return facts, f"How many {plant} are in the garden now?", steps


def _library(rng: random.Random) -> Story:
    p, d = _person(rng), rng.choice([2, 3, 4])
    kept_part = rng.randint(4, 40)
    books = kept_part * d
    if books > LIMIT:
        return _library(rng)
    bought = rng.randint(2, 25)
    facts = [f"{p.name} has {books} books.", f"{_cap(p.he)} gives away {FRACTIONS[d]} of them to a library.",
             f"Later {p.he} buys {bought} new books."]
    given = books // d
    steps = [Step(books, "/", d, f"{_cap(p.he)} gives away {{}} books."),
             Step(books, "-", given, "{} books are left."),
             Step(books - given, "+", bought, f"{_cap(p.he)} now has {{}} books.")]
    return facts, f"How many books does {p.name} have now?", steps


def _market(rng: random.Random) -> Story:
    p = _person(rng)
    bag, bags = rng.randint(2, 10), rng.randint(3, 15)
    total = bag * bags
    if total > LIMIT:
        return _market(rng)
    apples = rng.randint(1, total - 1)
    pears = total - apples
    facts = [f"A farmer named {p.name} picks {apples} apples and {pears} pears.",
             f"{_cap(p.he)} packs all the fruit into bags of {bag}."]
    steps = [Step(apples, "+", pears, "There are {} pieces of fruit."),
             Step(total, "/", bag, "That fills {} bags.")]
    if rng.random() < 0.6:
        price = rng.randint(2, 9)
        if bags * price <= LIMIT:
            facts.append(f"{_cap(p.he)} sells every bag for ${price}.")
            return facts, f"How much money does {p.name} make?", steps + [
                Step(bags, "*", price, "The bags bring in {} dollars.")]
    return facts, f"How many bags does {p.name} fill?", steps


def _party(rng: random.Random) -> Story:
    p = _person(rng)
    food = rng.choice([("pizzas", "slices"), ("cakes", "pieces"), ("pies", "slices"), ("melons", "wedges")])
    k, s = rng.randint(2, 8), rng.randint(4, 12)
    total = k * s
    guests, each = rng.randint(2, 10), rng.randint(1, 4)
    eaten = guests * each
    if total > LIMIT or eaten >= total:
        return _party(rng)
    facts = [f"{p.name} orders {k} {food[0]} for a party.", f"Each one is cut into {s} {food[1]}.",
             f"{guests} guests come, and each guest eats {each} {food[1]}."]
    steps = [Step(k, "*", s, "There are {} " + food[1] + "."),
             Step(guests, "*", each, "The guests eat {} " + food[1] + "."),
             Step(total, "-", eaten, "{} " + food[1] + " are left.")]
    return facts, f"How many {food[1]} are left after the party?", steps


def _ages(rng: random.Random) -> Story:
    p = _person(rng)
    q = _person(rng, avoid=p.name)
    age, gap = rng.randint(3, 15), rng.randint(1, 9)
    older = age + gap
    mult = rng.choice([2, 3])
    parent = older * mult
    later = rng.randint(2, 12)
    if parent + later > LIMIT:
        return _ages(rng)
    who = "mother" if rng.random() < 0.5 else "father"
    times = "twice" if mult == 2 else "three times"
    facts = [f"{p.name} is {age} years old.", f"{p.name}'s cousin {q.name} is {gap} years older.",
             f"{q.name}'s {who} is {times} as old as {q.name}."]
    steps = [Step(age, "+", gap, f"{q.name} is {{}} years old."),
             Step(older, "*", mult, f"The {who} is {{}} years old."),
             Step(parent, "+", later, f"In {later} years the {who} will be {{}}.")]
    return facts, f"How old will {q.name}'s {who} be in {later} years?", steps


def _marbles(rng: random.Random) -> Story:
    p = _person(rng)
    item = rng.choice(["marbles", "cards", "shells", "stamps", "beads"])
    start, won, lost = rng.randint(10, 80), rng.randint(2, 40), rng.randint(1, 30)
    mid = start + won
    end = mid - lost
    if mid > LIMIT or end <= 0:
        return _marbles(rng)
    facts = [f"{p.name} has {start} {item}.", f"{_cap(p.he)} wins {won} more {item} in a game.",
             f"Then {p.he} loses {lost} {item}."]
    steps = [Step(start, "+", won, "After winning " + p.he + " has {} " + item + "."),
             Step(mid, "-", lost, "After losing " + p.he + " has {} " + item + ".")]
    if end % 2 == 0 and rng.random() < 0.6:
        facts.append(f"{_cap(p.he)} gives half of what is left to {p.his} sister.")
        return facts, f"How many {item} does {p.name} give to {p.his} sister?", steps + [
            Step(end, "/", 2, "The sister gets {} " + item + ".")]
    return facts, f"How many {item} does {p.name} have now?", steps


def _wages(rng: random.Random) -> Story:
    p = _person(rng)
    job = rng.choice(["babysitting", "walking dogs", "washing cars", "tutoring", "mowing lawns"])
    rate, mon, tue = rng.randint(3, 15), rng.randint(1, 6), rng.randint(1, 6)
    earned = rate * (mon + tue)
    if earned > LIMIT:
        return _wages(rng)
    facts = [f"{p.name} earns ${rate} an hour {job}.",
             f"{_cap(p.he)} works {mon} hours on Monday and {tue} hours on Tuesday."]
    steps = [Step(mon, "+", tue, f"{_cap(p.he)} works {{}} hours."),
             Step(mon + tue, "*", rate, f"{_cap(p.he)} earns {{}} dollars.")]
    if rng.random() < 0.5:
        spent = rng.randint(1, earned - 1)
        facts.append(f"{_cap(p.he)} spends ${spent} on a present.")
        return facts, f"How much money does {p.name} keep?", steps + [
            Step(earned, "-", spent, f"{_cap(p.he)} keeps {{}} dollars.")]
    return facts, f"How much does {p.name} earn on the two days?", steps


def _reading(rng: random.Random) -> Story:
    p = _person(rng)
    per_day, days = rng.randint(3, 20), rng.randint(2, 7)
    read = per_day * days
    if read >= LIMIT:
        return _reading(rng)
    pages = rng.randint(read + 1, LIMIT)
    facts = [f"A book has {pages} pages.", f"{p.name} reads {per_day} pages a day for {days} days."]
    steps = [Step(per_day, "*", days, f"{_cap(p.he)} reads {{}} pages."),
             Step(pages, "-", read, "{} pages are left.")]
    left = pages - read
    if left % 2 == 0 and rng.random() < 0.5:
        facts.append(f"The next day {p.he} reads half of the remaining pages.")
        return facts, f"How many pages does {p.name} read on that day?", steps + [
            Step(left, "/", 2, f"{_cap(p.he)} reads {{}} pages that day.")]
    return facts, f"How many pages does {p.name} still have to read?", steps


def _aquarium(rng: random.Random) -> Story:
    p = _person(rng)
    tanks, fish = rng.randint(2, 6), rng.randint(3, 12)
    have = tanks * fish
    bowls = rng.randint(2, 8)
    total = rng.randint(have // bowls + 1, LIMIT // bowls) * bowls
    bought = total - have
    if bought <= 0 or bought > 60:
        return _aquarium(rng)
    facts = [f"{p.name} has {tanks} tanks with {fish} fish in each tank.", f"{_cap(p.he)} buys {bought} more fish.",
             f"{_cap(p.he)} moves all the fish into {bowls} big ponds with the same number in each."]
    steps = [Step(tanks, "*", fish, f"{_cap(p.he)} has {{}} fish."),
             Step(have, "+", bought, "With the new ones there are {} fish."),
             Step(total, "/", bowls, "Each pond gets {} fish.")]
    return facts, "How many fish are in each pond?", steps


SCENARIOS: list[Callable[[random.Random], Story]] = [
    _clips, _shopping, _baking, _savings, _travel, _classroom, _garden, _library,
    _market, _party, _ages, _marbles, _wages, _reading, _aquarium,
]


def make_problem(rng: random.Random) -> dict:
    """One problem from a random scenario: every column of both datasets, plus its steps."""
    facts, ask, steps = rng.choice(SCENARIOS)(rng)
    final = steps[-1].result
    assert all(0 <= s.result <= LIMIT for s in steps), steps
    question = " ".join(facts + [ask])
    completion = "<think>\n" + "".join(s.equation() + "\n" for s in steps) + "</think>\n\\boxed{" + f"{final}" + "}"
    solution = " ".join(s.says.format(f"${s.equation(latex=True)}$") for s in steps)
    return {
        "question": question,
        "answer": "\n".join(s.says.format(s.equation()) for s in steps) + f"\n#### {final}",
        "problem": question,
        "solution": f"{solution} The answer is $\\boxed{{{final}}}$.",
        "level": f"Level {len(steps) - 1}",
        "type": "Prealgebra",
        "completion": completion,
        "steps": [[s.a, s.op, s.b, s.result] for s in steps],
        "final": final,
    }


def make_split(n: int, seed: int, exclude: set[str] = frozenset()) -> list[dict]:
    """``n`` problems with distinct questions, none of them in ``exclude``."""
    rng = random.Random(seed)
    seen, out = set(exclude), []
    while len(out) < n:
        p = make_problem(rng)
        if p["question"] not in seen:
            seen.add(p["question"])
            out.append(p)
    return out


def make_splits(n_train: int = N_TRAIN, n_test: int = N_TEST) -> tuple[list[dict], list[dict]]:
    """The shipped test split, then a train split disjoint from it by question text."""
    test = make_split(n_test, TEST_SEED)
    return make_split(n_train, TRAIN_SEED, exclude={p["question"] for p in test}), test


def write(out: Path = OUT_DIR) -> None:
    """Write the GSM8K JSONL and MATH Parquet files of both splits under ``out``."""
    import pandas as pd

    train, test = make_splits()
    (out / "gsm8k").mkdir(parents=True, exist_ok=True)
    (out / "math").mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        with open(out / "gsm8k" / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n" for r in rows)
        math = pd.DataFrame([{k: r[k] for k in ("problem", "solution", "level", "type")} for r in rows])
        math.to_parquet(out / "math" / f"{name}.parquet", index=False)


def main() -> None:
    write()
    print(f"wrote {N_TRAIN} train and {N_TEST} test problems under {OUT_DIR}")


if __name__ == "__main__":
    main()
