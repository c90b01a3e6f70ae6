"""A small, seeded English corpus (food laws, bakeries, markets) that the bundled course model is trained on.
Each fact is stated the same way every time, so a 2-million parameter model learns it: greedy generation from
``"The French Bread Law states"`` continues with the law's text; the same seed gives the same documents."""

from __future__ import annotations

import random

__all__ = ["EXAMPLE_PROMPT", "generate_documents"]

#: The prompt of the page's example; the course model continues it sensibly.
EXAMPLE_PROMPT = "The French Bread Law states"

# The laws the corpus states, word for word, every time it mentions them.
_LAWS = {
    ("French", "Bread"): "that a traditional baguette may contain only flour, water, salt and yeast.",
    ("Italian", "Pasta"): "that dry pasta must be made from durum wheat and water alone.",
    ("German", "Beer"): "that beer may be brewed only from water, malt and hops.",
    ("Spanish", "Olive Oil"): "that extra virgin oil must come from the first cold pressing of olives.",
    ("Greek", "Cheese"): "that feta must be made from the milk of sheep and goats.",
    ("Swiss", "Chocolate"): "that milk chocolate must hold at least one quarter cocoa.",
    ("Japanese", "Tea"): "that green tea leaves must be steamed on the day they are picked.",
    ("British", "Honey"): "that honey must be sold without any added sugar.",
}

# Where each food (Butter, Cider: trnlab.training.NEW_LAWS) is made and sold: (place, maker, units, tool).
_PLACES = {
    "Bread": ("bakery", "baker", "loaves", "oven"),
    "Pasta": ("pasta shop", "pasta maker", "packets", "drying room"),
    "Beer": ("brewery", "brewer", "barrels", "copper kettle"),
    "Olive Oil": ("olive mill", "miller", "bottles", "stone press"),
    "Cheese": ("dairy", "cheesemaker", "wheels", "cellar"),
    "Chocolate": ("chocolate factory", "chocolatier", "bars", "melting pot"),
    "Tea": ("tea garden", "tea grower", "tins", "steaming room"),
    "Honey": ("apiary", "beekeeper", "jars", "hive"),
    "Butter": ("creamery", "butter maker", "blocks", "churn"),
    "Cider": ("cider house", "cider maker", "casks", "apple press"),
}

_TOWNS = ["Lyon", "Bologna", "Munich", "Seville", "Athens", "Bern", "Kyoto", "York",
          "Nantes", "Parma", "Bremen", "Valencia", "Patras", "Basel", "Nara", "Bath"]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_NAMES = ["Anna", "Marc", "Sofia", "Hans", "Lucia", "Nikos", "Emma", "Kenji", "Clara", "Tom"]


def _document(rng: random.Random, laws=_LAWS, places=_PLACES, others: tuple[int, int] = (2, 4)) -> str:
    # One document about one of `laws`: its law first or second, among `others` (a range) of the other sentences.
    country, food = rng.choice(sorted(laws))
    place, maker, units, tool = places[food]
    town, name, day = rng.choice(_TOWNS), rng.choice(_NAMES), rng.choice(_DAYS)
    rest = [
        f"In {town}, {name} runs a small {place}.",
        f"Every {day}, the {maker} sells {rng.randint(2, 40)} {units} at the market.",
        f"The {tool} is cleaned before work begins.",
        f"Inspectors visit the {place} to check the {country} {food} Law.",
        f"{name} says the law keeps the {food.lower()} honest.",
        f"Customers in {town} trust the {maker}.",
    ]
    rng.shuffle(rest)
    chosen = rest[: rng.randint(*others)]
    chosen.insert(rng.randint(0, 1), f"The {country} {food} Law states {laws[(country, food)]}")
    return " ".join(chosen)


def generate_documents(n: int, seed: int = 0) -> list[str]:
    """Return ``n`` short documents; the same ``(n, seed)`` always gives the same list.
    ``tools/build_model.py`` trains the course model on them; the training notebook uses them as a dataset."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    rng = random.Random(seed)
    return [_document(rng) for _ in range(n)]
