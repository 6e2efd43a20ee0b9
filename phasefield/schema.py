"""One name per quantity, for every block, every command, theory and simulation.

The results of the theory (``layers.fixed_point_exponents``, ``layers.finite_depth``, ``layers.rates``,
``layers.paper.exponents``, the sweeps' datasets), of the simulations (``_se`` beside each
measured quantity) and of the probe use the names of :data:`NAMES`, and no other. Files
written by earlier releases called two of them ``lambda_g`` (which one depended on the file)
and ``lambda_g_collapsed``; :func:`canonical` reads such a file under the names of today.
"""

from __future__ import annotations

NAMES = {
    "lambda_a": "angle exponent at the collapsed fixed point (NaN: no finite fixed point)",
    "angle_rate": "angle rate of nearby tokens (1/L) log[(1 - rho_L)/(1 - rho_0)], rho_0 -> 1 (from q0)",
    "lambda_g_input": "gradient rate lambda_g(L) = (1/L) log(a + b) from the input geometry (q0, rho0)",
    "lambda_g_collapse": "gradient rate lambda_g(L) from collapsed input tokens (norm q0; the fixed-point exponents: q*)",
    "lambda_g_inf": "gradient exponent at infinite depth (at the attractor)",
    "q_L": "token squared norm per component after L blocks from q0",
    "rho_L": "token cosine after L blocks from rho0",
    "q_star": "squared norm per component at the collapsed fixed point",
    "rho_star": "token cosine at the attractor reached from rho0 = 1/2",
    "q_L_pos": "per position i: token i's squared norm per component C_ii after L blocks from (q0, rho0) (full Gram)",
    "rho_L_pos": "per position i: token i's mean cosine with the tokens j < i after L blocks (position 0: 0)",
    "angle_rate_last": "the last token's angle rate (1/L) log[(1 - rho_L)/(1 - rho_0)], rho_0 -> 1 (from q0), "
    "rho the last token's mean cosine with the earlier tokens",
    "lambda_g_last": "the last token's gradient rate (1/L) log G_0[n-1, n-1], G_L = I, from (q0, rho0)",
    "q_pos": "per layer l (0: the input) and position i: token i's squared norm per component C_ii after l "
    "blocks from (q0, rho0) (full Gram; a causal block's trajectory)",
    "rho_pos": "per layer l (0: the input) and position i: token i's mean cosine with the tokens j < i after "
    "l blocks (position 0: 0)",
}
SYMBOLS = {
    "lambda_a": "λ_a",
    "angle_rate": "(1/L) log[(1-ρ_L)/(1-ρ_0)]",
    "lambda_g_input": "λ_g(L; q0, ρ0)",
    "lambda_g_collapse": "λ_g(L)",
    "lambda_g_inf": "λ_g^∞",
    "q_L": "q_L",
    "rho_L": "ρ_L",
    "q_star": "q*",
    "rho_star": "ρ*",
    "q_L_pos": "q_L(i)",
    "rho_L_pos": "ρ_L(i)",
    "angle_rate_last": "(1/L) log[(1-ρ_L(n))/(1-ρ_0)]",
    "lambda_g_last": "λ_g(L; n)",
    "q_pos": "q_l(i)",
    "rho_pos": "ρ_l(i)",
}
# how files written by releases before 0.3.0 named the gradient rates, by the kind of file:
# the paper block's grids and simulations (lambda_g: from the collapsed point) ...
EARLIER_COLLAPSE = {
    "lambda_g": "lambda_g_collapse",
    "lambda_g_se": "lambda_g_collapse_se",
    "lambda_g_collapsed": "lambda_g_collapse",
}
# ... and the other blocks' grids and simulations (lambda_g: from the input geometry)
EARLIER_INPUT = {
    "lambda_g": "lambda_g_input",
    "lambda_g_se": "lambda_g_input_se",
    "lambda_g_collapsed": "lambda_g_collapse",
}


def canonical(ds, earlier):
    """``ds`` (a dataset or dict, perhaps written by an earlier release) under the names of
    :data:`NAMES`: the copies a 0.2 file carried under earlier names (attribute
    ``deprecated``) dropped, and each earlier name of ``earlier`` (:data:`EARLIER_COLLAPSE`,
    :data:`EARLIER_INPUT`) renamed to its name of today where that is missing."""
    if hasattr(ds, "data_vars"):
        ds = ds.drop_vars([v for v in ds.data_vars if "deprecated" in ds[v].attrs])
    keys = ds.data_vars if hasattr(ds, "data_vars") else ds
    ren = {old: new for old, new in earlier.items() if old in keys and new not in keys}
    if not ren:
        return ds
    if hasattr(ds, "rename"):
        return ds.rename(ren)
    return {ren.get(k, k): v for k, v in ds.items()}
