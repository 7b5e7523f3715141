"""The report's protocol, shared by every comparison: what a recipe is, how each model is tuned to its best, how
seeds are spent, and how numbers are summarised for a verdict.

    recipe     an optimizer and its learning rates: AdamW alone (lr), or Muon on the hidden matrices (muon_lr) with
               AdamW on the rest (lr)
    tuning     each model on its own grids: AdamW's lr, then Muon's muon_lr with the AdamW part at that lr; every
               grid point on the grid seeds, a grid widened past an end that wins (seed_grid); the recipe of best
               merit on the selection (validation) split is the model's best; the test split scores it once
    seeds      the chosen recipe then runs with every seed; a result is its mean and min-max over them
    verdict    each reason's file states its rule as a constant before any run; the code applies it to the numbers
"""
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
    """One model tuned on one optimizer's grid, or (best_recipe) its best over optimizers: the chosen recipe, the
    grid tried with each point's merit, whether the choice sits at an end of the grid after widening, whether the
    grid was flat (no point told apart from another, so not widened), and the chosen recipe's runs, one per seed."""
    recipe: Recipe
    tried: list  # [(Recipe, merit)] in grid order
    edge: bool
    runs: dict  # seed -> run
    flat: bool = False
    others: list = field(default_factory=list)  # the other optimizers' Tuned, where best_recipe chose among several

    @property
    def lrs(self):
        return [recipe.grid_lr for recipe, _ in self.tried]


def seed_grid(fit, lrs, seeds, grid_seeds, merit, widen=3, flat=None):
    """fit(lr, seed) at every lr with the first grid_seeds seeds, the lr of the highest merit(its runs) chosen, then
    trained with the remaining seeds. While the best sits at an end of the grid, the grid grows one step past that
    end (the ratio of its last two points), at most widen times, so the chosen lr lies strictly inside what was tried
    whenever that can be shown; unless flat(every run so far) says no lr is told apart from another. Returns the lr,
    the lrs tried (sorted), the grid {(lr, seed): run} and the chosen lr's runs {seed: run}."""
    lrs = sorted(lrs)
    grid = {(lr, seed): fit(lr, seed) for lr in lrs for seed in seeds[:grid_seeds]}

    def choose():
        return max(lrs, key=lambda lr: merit([grid[lr, seed] for seed in seeds[:grid_seeds]]))

    best = choose()
    for _ in range(widen if len(lrs) > 1 else 0):
        if best not in (lrs[0], lrs[-1]) or (flat and flat(list(grid.values()))):
            break
        lr = lrs[0] ** 2 / lrs[1] if best == lrs[0] else lrs[-1] ** 2 / lrs[-2]
        lr = float(f"{lr:.3g}")
        grid |= {(lr, seed): fit(lr, seed) for seed in seeds[:grid_seeds]}
        lrs = sorted([*lrs, lr])
        best = choose()
    return best, lrs, grid, {seed: grid.get((best, seed)) or fit(best, seed) for seed in seeds}


def tune(fit, recipe_at, lrs, seeds, grid_seeds, merit, flat=None, widen=3):
    """One optimizer's grid for one model: recipe_at(lr) is the recipe at grid point lr, fit(recipe, seed) trains it.
    Returns a Tuned whose runs cover every seed at the chosen point."""
    grid_seeds = min(grid_seeds, len(seeds))
    best, tried, grid, runs = seed_grid(lambda lr, seed: fit(recipe_at(lr), seed), lrs, seeds, grid_seeds, merit,
                                        widen, flat)
    points = [(recipe_at(lr), merit([grid[lr, seed] for seed in seeds[:grid_seeds]])) for lr in tried]
    is_flat = bool(flat and flat(list(grid.values())))
    edge = not is_flat and len(tried) > 1 and best in (tried[0], tried[-1])
    return Tuned(recipe_at(best), points, edge, runs, is_flat)


def best_recipe(fit, adamw_lrs, muon_lrs, seeds, grid_seeds, merit, flat=None, widen=3):
    """Each model at its best: AdamW's lr grid, then Muon's muon_lr grid with its AdamW part at AdamW's chosen lr
    (skipped when muon_lrs is empty); the optimizer whose chosen runs have the higher merit over every seed."""
    adamw = tune(fit, lambda lr: Recipe("adamw", lr), adamw_lrs, seeds, grid_seeds, merit, flat, widen)
    if not muon_lrs:
        return adamw
    muon = tune(fit, lambda lr: Recipe("muon", adamw.recipe.lr, lr), muon_lrs, seeds, grid_seeds, merit, flat,
                widen)
    best, other = (muon, adamw) if merit(list(muon.runs.values())) > merit(list(adamw.runs.values())) else (adamw, muon)
    best.others = [other]
    return best


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
