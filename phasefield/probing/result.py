"""The probe's answer: per-block measurements with standard errors over initializations
(an ``xarray.Dataset``), the rates, the phase and a verdict in words.

Rates (finite-depth, from the measurements):

* ``angle_rate = (1/L) log[(1 - rho_L) / (1 - rho_0)]`` of nearby tokens, i.e. the mean
  over blocks of the per-block angle growth (per init, then mean and standard error);
* ``lambda_g_input = (1/L) log E|J^T u|^2 / |x0|``, J the Jacobian of the whole stack (the mean
  over inits inside the log; its standard error by the delta method).

Phase: ordered (angle_rate < 0: nearby tokens merge, rank collapse) or chaotic (> 0), and
vanishing (lambda_g_input < 0) or exploding (> 0) gradients; within 3 standard errors of 0 it is
"edge" / "stable".

A causal model (``causal``) has no permutation symmetry: its rates are the last token's,
``angle_rate_last`` and ``lambda_g_last`` (:mod:`.positions`), which its phase, verdict,
per-block bands and fix read, and its per-position ``q_L_pos``, ``rho_L_pos`` (from the
symmetric start) are compared with :func:`phasefield.layers.causal_rates` position by
position (:meth:`ProbeResult.position_agreement`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import xarray as xr

Z = 3.0
RESOLUTION = 1e-5  # relative: float32 rounding and the norms' epsilon (1e-6)
PER_BLOCK = ("q_data", "rho_data", "q_sym", "rho_sym", "gap", "angle", "grad", "gap_last", "angle_last", "grad_last")
# per position after the last block: the raw name -> the dataset's (the schema's names)
PER_POSITION = {
    "q_pos": "q_L_pos",
    "rho_pos": "rho_L_pos",
    "q_pos_data": "q_L_pos_data",
    "rho_pos_data": "rho_L_pos_data",
}


def _se(a, axis=0):
    a = np.asarray(a, float)
    n = a.shape[axis]
    return a.std(axis, ddof=1) / math.sqrt(n) if n > 1 else np.full(np.delete(a.shape, axis), np.nan)


def dataset(raw: dict) -> xr.Dataset:
    """Per-init arrays (dims init, block) -> Dataset with ``<name>`` (mean over inits),
    ``<name>_se`` and the raw ``<name>_init``."""
    raw = {k: np.asarray(v, float) for k, v in raw.items() if k not in ("finite", "grad_finite")}
    gap = raw["gap"]
    raw["angle"] = _angle(gap)
    if "gap_last" in raw:
        raw["angle_last"] = _angle(raw["gap_last"])
    inits, nb = gap.shape
    ds = xr.Dataset(coords=dict(block=np.arange(nb), init=np.arange(inits)))
    for k in PER_BLOCK:
        if k in raw:
            ds[k] = ("block", raw[k].mean(0))
            ds[k + "_se"] = ("block", _se(raw[k]))
            ds[k + "_init"] = (("init", "block"), raw[k])
    for k, name in PER_POSITION.items():
        if k in raw:
            ds = ds.assign_coords(position=np.arange(raw[k].shape[1]))
            ds[name] = ("position", raw[k].mean(0))
            ds[name + "_se"] = ("position", _se(raw[k]))
            ds[name + "_init"] = (("init", "position"), raw[k])
    return ds


def _angle(gap):
    return np.concatenate([np.full((gap.shape[0], 1), np.nan), np.diff(np.log(gap), axis=1)], 1)


def classify(value, se, neg, pos, mid):
    if not np.isfinite(value):
        return "undetermined"
    if np.isfinite(se) and abs(value) <= Z * se:
        return mid
    return neg if value < 0 else pos


@dataclasses.dataclass
class ProbeResult:
    """``ds``: per-block measurements (:func:`dataset`); ``theory``: the theory's curves
    (:mod:`.theory`) when the model is a phasefield block, else None; ``causal``: the model
    is causal (per-position measurements, the last token's rates); ``causal_theory``: then
    :func:`phasefield.layers.causal_rates` of its block (:func:`.theory.causal`), else None."""

    name: str
    ds: xr.Dataset
    start: tuple
    eps: float
    theory: dict | None = None
    max_factor: float = 10.0
    max_angle_rate: float = 0.05
    fix: dict | None = None
    causal: bool = False
    causal_theory: dict | None = None

    def diagnosis(self) -> dict:
        """Per-block rates against the bands of the criteria (:func:`.blocks.diagnose`; a
        causal model's: the last token's)."""
        from .blocks import diagnose

        return diagnose(self.ds, self.max_factor, self.max_angle_rate, last=self.causal)

    @property
    def first_failing_block(self) -> dict | None:
        """The first block leaving its band (:mod:`.blocks`), or None."""
        return self.diagnosis()["first_failing_block"]

    @property
    def depth(self) -> int:
        return int(self.ds.sizes["block"]) - 1

    @property
    def inits(self) -> int:
        return int(self.ds.sizes["init"])

    @property
    def angle_rate(self) -> tuple:
        """(value, se): the angle rate of nearby tokens, (1/L) log of their gap's growth."""
        g = self.ds["gap_init"].values
        per = np.log(g[:, -1] / g[:, 0]) / self.depth
        return float(per.mean()), float(_se(per))

    @property
    def lambda_g_input(self) -> tuple:
        """(value, se): lambda_g(L) from the inputs, (1/L) log of the gradient energy's growth."""
        if "grad_init" not in self.ds:
            return float("nan"), float("nan")
        g = self.ds["grad_init"].values[:, 0]
        return float(np.log(g.mean()) / self.depth), float(_se(g) / g.mean() / self.depth)

    def _last(self) -> dict:
        from .positions import last_rates

        if "gap_last_init" not in self.ds:
            raise ValueError("the last token's rates are measured on a causal model only (causal=True)")
        gap = self.ds["gap_last_init"].values
        if "grad_last_init" in self.ds:
            g = self.ds["grad_last_init"].values
            g0, uL = g[:, 0], g[:, -1]
        else:
            g0 = uL = np.full(gap.shape[0], np.nan)
        return last_rates(gap[:, 0], gap[:, -1], g0, uL, self.depth)

    @property
    def angle_rate_last(self) -> tuple:
        """(value, se): the last token's angle rate (:mod:`.positions`; a causal model only)."""
        r = self._last()
        return r["angle_rate_last"], r["angle_rate_last_se"]

    @property
    def lambda_g_last(self) -> tuple:
        """(value, se): the last token's gradient rate (:mod:`.positions`; a causal model only)."""
        r = self._last()
        return r["lambda_g_last"], r["lambda_g_last_se"]

    @property
    def rate_names(self) -> tuple:
        """The names of the two rates the phase, the bands and the fix read: the last token's
        for a causal model."""
        return ("angle_rate_last", "lambda_g_last") if self.causal else ("angle_rate", "lambda_g_input")

    @property
    def rates(self) -> tuple:
        """((angle value, se), (gradient value, se)) of :attr:`rate_names`."""
        return tuple(getattr(self, k) for k in self.rate_names)

    @property
    def phase(self) -> tuple:
        (la, la_se), (lg, lg_se) = self.rates
        return (
            classify(la, la_se, "ordered", "chaotic", "edge"),
            classify(lg, lg_se, "vanishing", "exploding", "stable"),
        )

    def theory_rates(self) -> dict:
        if self.causal_theory is not None:
            return {k: float(self.causal_theory[k]) for k in ("angle_rate_last", "lambda_g_last")}
        if self.theory is None:
            return {}
        t, L = self.theory, self.depth
        return dict(
            angle_rate=float(np.log(t["gap"][-1] / t["gap"][0]) / L), lambda_g_input=float(t["log_grad"][0] / L)
        )

    def positions(self) -> dict:
        """The per-position measurements of a causal model: ``q_L_pos``, ``rho_L_pos`` (from
        the symmetric start), ``angle_rate_last``, ``lambda_g_last``, each with ``_se``, and
        ``q_L_pos_data``, ``rho_L_pos_data`` (from the inputs); ValueError for a model probed
        as not causal."""
        if not self.causal:
            raise ValueError("per-position results need a causal model (causal=True)")
        out = {}
        for name in ("q_L_pos", "rho_L_pos", "q_L_pos_data", "rho_L_pos_data"):
            out[name], out[name + "_se"] = self.ds[name].values, self.ds[name + "_se"].values
        out.update(self._last())
        return out

    def verdict(self) -> str:
        (la, la_se), (lg, lg_se) = self.rates
        ang, grad = self.phase
        L = self.depth
        r0, rl = float(self.ds["rho_data"][0]), float(self.ds["rho_data"][-1])
        words = {
            "ordered": "ordered (nearby tokens merge)",
            "chaotic": "chaotic (nearby tokens separate)",
            "edge": "at the edge of chaos (nearby tokens keep their angle)",
            "undetermined": "undetermined",
        }
        what = "the last token and nearby earlier tokens" if self.causal else "nearby tokens"
        out = [
            f"{self.name}: {words[ang]}, {grad} gradients, over {L} blocks and {self.inits} initializations"
            + (" (causal: the last token's rates)." if self.causal else ".")
        ]
        if np.isfinite(la):
            out.append(
                f"The angle between {what} changes by a factor {math.exp(la):.3f} per block "
                f"({self.rate_names[0]} = {la:+.4f} +- {la_se:.4f}); the mean token cosine of your inputs goes "
                f"from {r0:.3f} to {rl:.3f}" + (" (rank collapse)." if rl > 0.9 and rl > r0 else ".")
            )
        else:
            out.append(f"The angle rate is not finite ({self.rate_names[0]} = {la}).")
        if np.isfinite(lg):
            q0, qL = float(self.ds["q_data"][0]), float(self.ds["q_data"][-1])
            into = "the last input token" if self.causal else "the first block's input"
            name = "lambda_g_last" if self.causal else "lambda_g(L)"
            out.append(
                f"A gradient entering at block {L}'s output reaches {into} "
                f"{math.exp(lg * L):.3g} times as large (squared norm; {name} = {lg:+.4f} "
                f"+- {lg_se:.4f} per block), while the tokens' squared norm grows {qL / q0:.3g} times "
                f"(behind normalizations, gradients scale as 1/norm)."
            )
        advice = {
            ("ordered", "vanishing"): "Deeper, it loses token information and gradient: a larger init "
            "std or branch scale moves it toward the edge.",
            ("chaotic", "exploding"): "Deeper, nearby inputs decorrelate and gradients blow up: a smaller "
            "init std or branch scale moves it toward the edge.",
            ("ordered", "exploding"): "Tokens merge while gradients grow: check the residual scaling.",
            ("chaotic", "vanishing"): "Tokens separate while gradients shrink: check the normalization.",
        }
        if (ang, grad) in advice:
            out.append(advice[(ang, grad)])
        elif ang == "edge" or grad == "stable":
            out.append("Close to critical at this depth: a good place to start training.")
        from .blocks import describe

        out.append(describe(self.first_failing_block, L, self.max_factor, self.max_angle_rate))
        return " ".join(out)

    def to_dict(self) -> dict:
        la, la_se = self.angle_rate
        lg, lg_se = self.lambda_g_input
        per = {k: self.ds[k].values.tolist() for k in PER_BLOCK if k in self.ds}
        per.update({k + "_se": self.ds[k + "_se"].values.tolist() for k in PER_BLOCK if k in self.ds})
        diag = self.diagnosis()
        if diag["grad_rate"] is not None:
            per["grad_rate"] = diag["grad_rate"].tolist()
            per["grad_rate_se"] = diag["grad_rate_se"].tolist()
        out = dict(
            model=self.name,
            depth=self.depth,
            inits=self.inits,
            causal=bool(self.causal),
            start=list(self.start),
            eps=self.eps,
            angle_rate=la,
            angle_rate_se=la_se,
            lambda_g_input=lg,
            lambda_g_input_se=lg_se,
        )
        if self.causal:
            out.update({k: _json(v) for k, v in self.positions().items()})
        out.update(
            rates=list(self.rate_names),
            phase=list(self.phase),
            verdict=self.verdict(),
            criteria=dict(
                max_gradient_factor=self.max_factor,
                max_angle_rate=self.max_angle_rate,
                gradient_band=diag["gradient_band"],
                angle_band=diag["angle_band"],
            ),
            first_failing_block=diag["first_failing_block"],
            blocks=per,
        )
        if self.causal_theory is not None:
            out["theory"] = {k: _json(v) for k, v in self.causal_theory.items()}
            z = self.position_agreement()
            out["z"] = {k: _json(v) for k, v in z.items() if k != "max_abs_z"}
            out["max_abs_z"] = z["max_abs_z"]
        elif self.theory is not None:
            out["theory"] = {k: np.asarray(v, float).tolist() for k, v in self.theory.items()}
            out["theory"].update(self.theory_rates())
        if self.fix is not None:
            out["fix"] = self.fix
        return out

    def position_agreement(self, resolution: float = RESOLUTION) -> dict:
        """z = (measured - theory) / se of a causal model against its causal theory, per
        position for ``q_L_pos`` and ``rho_L_pos`` (arrays [n]; position 0's rho has no
        earlier token: NaN) and for the last token's two rates, and ``max_abs_z``: the
        largest |z| with its quantity and position. Standard errors are floored at
        ``resolution`` x max(1, |theory|) (a quantity the block fixes, e.g. q after a
        LayerNorm)."""
        if not self.causal or self.causal_theory is None:
            raise ValueError("no causal theory for this model (a causal phasefield block, or one declared as one)")
        m, t = self.positions(), self.causal_theory
        z = {}
        for k in ("q_L_pos", "rho_L_pos", "angle_rate_last", "lambda_g_last"):
            th = np.asarray(t[k], float)
            se = np.maximum(np.asarray(m[k + "_se"], float), resolution * np.maximum(1.0, np.abs(th)))
            v = (np.asarray(m[k], float) - th) / se
            if k == "rho_L_pos":
                v = np.where(np.arange(v.size) == 0, np.nan, v)
            z[k] = v if k.endswith("_pos") else float(v)
        best = dict(value=float("nan"), quantity=None, position=None)
        for k, v in z.items():
            a = np.abs(np.atleast_1d(v))
            if np.any(np.isfinite(a)):
                i = int(np.nanargmax(a))
                if not abs(best["value"]) >= a[i]:
                    best = dict(
                        value=float(np.atleast_1d(v)[i]), quantity=k, position=i if k.endswith("_pos") else None
                    )
        z["max_abs_z"] = best
        return z

    def agreement(self, resolution: float = RESOLUTION) -> dict:
        """z = (measured - theory) / se for every per-block curve and the two rates (theory
        needed): {name: array of z over blocks 1..L} and {rate: z}. A quantity that the
        block fixes (q after a LayerNorm is 1 - eps/var, the same in every draw) has a
        standard error at float32 rounding; its se is floored at ``resolution`` x |theory|
        (default 1e-5: float32 and the norms' epsilon 1e-6), so such a curve agrees when it
        is equal to 1e-5 relative. A causal model: :meth:`position_agreement`."""
        if self.theory is None:
            raise ValueError(
                "no (q, p) theory for this model: a causal model is compared position by position (position_agreement)"
                if self.causal
                else "no theory for this model (it is not a phasefield block)"
            )
        t = self.theory
        z = {}
        for name, key in (("q_sym", "q"), ("rho_sym", "rho")):
            se = np.maximum(self.ds[name + "_se"].values[1:], resolution * np.abs(t[key][1:]))
            z[name] = (self.ds[name].values[1:] - t[key][1:]) / se
        z["angle"] = (self.ds["angle"].values[1:] - t["angle"][1:]) / self.ds["angle_se"].values[1:]
        if "grad" in self.ds:
            g, gse = self.ds["grad"].values[:-1], self.ds["grad_se"].values[:-1]
            z["log_grad"] = (np.log(g) - t["log_grad"][:-1]) / (gse / g)
        rates = self.theory_rates()
        la, la_se = self.angle_rate
        lg, lg_se = self.lambda_g_input
        z["angle_rate"] = (la - rates["angle_rate"]) / la_se
        z["lambda_g_input"] = (lg - rates["lambda_g_input"]) / lg_se
        return z


def _json(v):
    """A number or an array as JSON: lists, NaN as None."""
    a = np.asarray(v, float)
    if a.ndim == 0:
        return float(a) if np.isfinite(a) else None
    return [float(x) if np.isfinite(x) else None for x in a]
