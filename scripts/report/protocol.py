"""The protocol every comparison follows (docs/report.md says it in words): a recipe is an optimizer with its lrs;
each model is tuned on its own grids, every grid point on the first seed, a grid widened past an end that wins; the
chosen recipe then trains every seed; a result is a mean and a min-max over seeds."""
import statistics
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Recipe:
    optimizer: str  # adamw | muon
    lr: float  # AdamW's peak lr: every parameter under adamw, the embeddings, head and gains under muon
    muon_lr: float = 0.0  # Muon's peak lr on the hidden matrices (muon only)

    def __str__(self):
        return f"muon muon_lr {self.muon_lr:g} (AdamW part lr {self.lr:g})" if self.optimizer == "muon" else (
            f"adamw lr {self.lr:g}")

    @property
    def grid_lr(self):
        """The lr this recipe's grid moves: muon_lr for Muon, lr for AdamW."""
        return self.muon_lr if self.optimizer == "muon" else self.lr


@dataclass
class Tuned:
    """One model tuned on one grid: the chosen recipe, every grid point with its merit, whether the choice sits at an
    end of the grid after widening, whether the grid was flat (so not widened), the chosen recipe's runs by seed, and
    (best_recipe) the other optimizer's Tuned."""
    recipe: Recipe
    tried: list  # [(Recipe, merit)] in grid order
    edge: bool
    runs: dict  # seed -> run
    flat: bool = False
    others: list = field(default_factory=list)

    @property
    def lrs(self):
        return [recipe.grid_lr for recipe, _ in self.tried]

    @property
    def by_seed(self):
        """The chosen recipe's runs in seed order."""
        return [self.runs[seed] for seed in sorted(self.runs)]


def tune(fit, recipe_at, lrs, seeds, merit, flat=None, widen=3):
    """fit(recipe_at(lr), seeds[0]) at every lr; the lr of the highest merit([run]) is chosen. While it sits at an end
    of the grid, the grid grows one step past that end (the ratio of its last two points), at most widen times,
    unless flat(every run so far) says no lr is told apart from another. The chosen recipe then trains every seed."""
    lrs, seed = sorted(lrs), seeds[0]
    grid = {lr: fit(recipe_at(lr), seed) for lr in lrs}

    def choose():
        return max(lrs, key=lambda lr: merit([grid[lr]]))

    best = choose()
    is_flat = bool(flat and flat(list(grid.values())))
    for _ in range(widen if len(lrs) > 1 else 0):
        if best not in (lrs[0], lrs[-1]) or is_flat:
            break
        lr = float(f"{lrs[0] ** 2 / lrs[1] if best == lrs[0] else lrs[-1] ** 2 / lrs[-2]:.3g}")
        grid[lr] = fit(recipe_at(lr), seed)
        lrs = sorted([*lrs, lr])
        best = choose()
        is_flat = bool(flat and flat(list(grid.values())))
    runs = {s: grid[best] if s == seed else fit(recipe_at(best), s) for s in seeds}
    edge = not is_flat and len(lrs) > 1 and best in (lrs[0], lrs[-1])
    return Tuned(recipe_at(best), [(recipe_at(lr), merit([grid[lr]])) for lr in lrs], edge, runs, is_flat)


def best_recipe(fit, adamw_lrs, muon_lrs, seeds, merit, flat=None, widen=3):
    """A model at its best: AdamW's lr grid, then Muon's muon_lr grid with its AdamW part at AdamW's chosen lr; the
    optimizer whose chosen runs have the higher merit over every seed."""
    adamw = tune(fit, lambda lr: Recipe("adamw", lr), adamw_lrs, seeds, merit, flat, widen)
    muon = tune(fit, lambda lr: Recipe("muon", adamw.recipe.lr, lr), muon_lrs, seeds, merit, flat, widen)
    best, other = (muon, adamw) if merit(list(muon.runs.values())) > merit(list(adamw.runs.values())) else (adamw, muon)
    best.others = [other]
    return best


def combined(statuses):
    """Several rivals' statuses as one verdict: shown if every one shows, contradicted if any contradicts."""
    if "contradicted here" in statuses:
        return "contradicted here"
    return "shown here" if all(s == "shown here" for s in statuses) else "not shown here"


def mean_range(values, digits=3):
    """'mean [min, max]': a result over seeds."""
    return f"{statistics.mean(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def ratio_range(numerators, denominators, digits=1):
    """The ratio of two seed sets' medians and its range over every pairing: 'r (min-max)'."""
    ratios = [n / d for n in numerators for d in denominators]
    return (f"{statistics.median(numerators) / statistics.median(denominators):.{digits}f} "
            f"({min(ratios):.{digits}f}-{max(ratios):.{digits}f})")


def apart(a, b):
    """Two seed sets told apart: their min-max ranges do not overlap. Returns -1 (a lower), 1 (a higher) or 0."""
    if max(a) < min(b):
        return -1
    if min(a) > max(b):
        return 1
    return 0
