"""One post-LN sublayer's backward, measured piece by piece (docs/seeds.md, "post-LN backward").

z = LN(u), u = lam x + beta F(x), with x a LayerNorm output (unit second moment, token
correlation ``--r``), F the FFN or the attention sublayer of the DeepScaleLM stacks (DSLM
init, dropout 0.1) and an i.i.d. N(0, 1) gradient at z. Per draw it measures the pieces of
E|dL/dx|^2 / E|dL/dz|^2 = E[|P g|^2 / s^2] x (branch and skip terms):

* ``s2``: E s_u^2 (the centred second moment the LayerNorm divides by), ``inv_s2``: E[1/s_u^2];
* ``proj``: E[|P g|^2 s_u^2] / E|g|^2 ((d - 2)/d for an isotropic g);
* ``gain_gu`` / ``gain_iso``: the branch's backward gain on the LayerNorm gradient and on an
  isotropic vector; ``cross``: 2 lam beta E[g_u . J^T g_u] / E|g_u|^2;
* ``xi``: d E(g_x . x_hat)^2 / E|g_x|^2, the share of dL/dx along the LayerNorm output x (1 for
  an isotropic gradient; 0 for the FFN, Euler: z is scale-invariant in x);
* ``gx``: the whole step, against ``stack``'s rule (``theory``) and, for the FFN, the O(1/d)
  formula of docs/seeds.md (``ffn_formula``).

    PYTHONPATH=. python scripts/dslm_postln_step.py --branch ffn --d 64 --L 32 --lam2 0.5
"""

from __future__ import annotations

import argparse
import json
import math

import jax
import jax.numpy as jnp
import numpy as np

from phasefield.seeds import deepscalelm as ds
from phasefield.seeds.deepscalelm.simulate import _correlated, _ln
from phasefield.seeds.deepscalelm.simulate import branch as sample_branch


def ffn_formula(d, lam2, beta2, my, G, es2, cv2, p, mult=4):
    """E|g_x|^2 / E|g_z|^2 of a post-LN FFN step (isotropic g at z, x centred with unit second
    moment): E[1/s^2] [(lam^2 + beta^2 G)(1 - 1/d) - (lam^2 + beta^2 Gamma + C)/d] with
    Gamma = |J^T u_hat|^2 = G + (rho - 1) G w, C = 2 lam^2 w, w = beta^2 m_y / (lam^2 + beta^2 m_y),
    rho = 2 + 2/mult + p/(1 - p) (|J^T J x|^2 / (G |J x|^2)), E[1/s^2] = 1/((1 - cv2) E s^2)."""
    w = beta2 * my / (lam2 + beta2 * my)
    gam = G + (2 + 2 / mult + p / (1 - p) - 1) * G * w
    return ((lam2 + beta2 * G) * (1 - 1 / d) - (lam2 + beta2 * gam + 2 * lam2 * w) / d) / ((1 - cv2) * es2)


def measure(branch, d, L, lam2, beta2, r, draws, init, p=0.1, seed=0, batch=64):
    lam, beta = math.sqrt(lam2), math.sqrt(beta2)
    ini = (
        ds.xavier_init(d)
        if init == "xavier"
        else ds.dslm_init(d, p, 4, r=r, L=L)
        if branch == "attn"
        else ds.dslm_init(d, p)
    )

    def one(k):
        kx, kw, kd, kg, kh = jax.random.split(k, 5)
        x = _ln(_correlated(kx, (L, d), r))
        keep = jax.random.bernoulli(kd, 1 - p, (L, d))
        core = sample_branch(kw, ini, d, branch == "attn")  # the stacks' own sublayer
        F = lambda x: jnp.where(keep, core(x) / (1 - p), 0.0)
        y = F(x)
        u = lam * x + beta * y
        uc = u - u.mean(-1, keepdims=True)
        s2 = (uc * uc).mean(-1)
        g = jax.random.normal(kg, (L, d), jnp.float64)
        gx = jax.vjp(lambda x: _ln(lam * x + beta * F(x)), x)[1](g)[0]
        gu = jax.vjp(_ln, u)[1](g)[0]
        vF = jax.vjp(F, x)[1]
        jgu = vF(gu)[0]
        h = jax.random.normal(kh, (L, d), jnp.float64)
        m = lambda a: jnp.mean(a * a)
        gxx = jnp.sum(gx * x, -1) / jnp.sqrt(jnp.sum(x * x, -1))  # component along x_hat
        return jnp.stack(
            [
                m(gx),
                s2.mean(),
                (1 / s2).mean(),
                jnp.mean(gu * gu * s2[:, None]),
                m(gu),
                m(jgu),
                m(vF(h)[0]),
                2 * lam * beta * jnp.mean(gu * jgu),
                m(y),
                jnp.mean(gxx**2),
            ]
        )

    keys = jax.random.split(jax.random.PRNGKey(seed), draws).reshape(-1, batch, 2)
    v = np.asarray(jax.lax.map(jax.vmap(one), keys)).reshape(draws, -1)
    mean, se = v.mean(0), v.std(0, ddof=1) / math.sqrt(draws)
    gx, s2, inv, proj, gu, jgu, hiso, cross, y2, gxx = mean
    out = dict(
        branch=branch,
        d=d,
        L=L,
        lam2=lam2,
        beta2=beta2,
        r=r,
        init=init,
        draws=draws,
        gx=gx,
        gx_se=se[0],
        s2=s2,
        inv_s2=inv,
        proj=proj,
        gain_gu=jgu / gu,
        gain_iso=hiso,
        cross=cross / gu,
        y2=y2,
        xi=gxx / gx,
    )
    x = ds.Fwd(0.0, 1.0, r)
    if branch == "ffn":
        yth, c = ds.ffn_block(x, d, ini, p)
    else:
        yth, c = ds.attention_block(x, d, L, ini, p, True, 1.0)
    u = ds.residual(x, yth, lam2, beta2)
    g = ds.layernorm_bwd(ds.Bwd(1.0, 0.0), u.var, d)
    gb = ds.ffn_block_bwd(g, c, d, ini, p) if branch == "ffn" else ds.attention_block_bwd(g, c, d, L, ini, p)
    out["theory"] = float(ds.residual_bwd(g, gb, lam2, beta2).var)
    if branch == "ffn":
        my, G = float(yth.var), float(gb.var / g.var)
        cy = ds.norm_cv2_block(0.0, "ffn", d, p)
        cv2 = ds.norm_cv2_residual(x, 0.0, yth, cy, lam2, beta2, d, coupled=True)
        es2 = lam2 + beta2 * my * (1 - 1 / d)  # x is centred: only the branch loses its mean
        out["ffn_formula"] = float(ffn_formula(d, lam2, beta2, my, G, es2, cv2, p))
    return {k: float(v) if isinstance(v, (np.floating, float)) else v for k, v in out.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--branch", choices=("ffn", "attn"), default="ffn")
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--L", type=int, default=32)
    ap.add_argument("--lam2", type=float, default=0.5)
    ap.add_argument("--beta2", type=float, default=None, help="default 1 - lam2")
    ap.add_argument("--r", type=float, default=0.5)
    ap.add_argument("--init", choices=("dslm", "xavier"), default="dslm")
    ap.add_argument("--draws", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)  # this script owns its process
    if a.draws % 64 or a.d < 4 or a.L < 2:
        ap.error("--draws must be a multiple of 64, --d >= 4, --L >= 2")
    beta2 = 1 - a.lam2 if a.beta2 is None else a.beta2
    out = measure(a.branch, a.d, a.L, a.lam2, beta2, a.r, a.draws, a.init, seed=a.seed)
    for k in ("theory", "ffn_formula"):
        if k in out:
            out[k + "_err"] = out[k] / out["gx"] - 1
    print(json.dumps(out))


if __name__ == "__main__":
    main()
