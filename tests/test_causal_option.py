"""The causal mask as a property of the block: every preset takes ``causal=true`` (its
attention masked, :func:`phasefield.layers.causal.masked`), ``phasefield.exponents`` and the
point commands answer a causal block per position (:func:`phasefield.layers.causal_rates`),
its (q, p) maps refuse, and bad input is one line and exit 2 with no file left. (Without the
mask the per-position route is the (q, p) one: tests/test_causal.py.)"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import phasefield
from phasefield import layers
from phasefield.cli import main
from phasefield.layers import registry, spec
from phasefield.layers.attention import Attention
from phasefield.layers.causal import is_causal, masked
from phasefield.layers.qknorm import QKNormAttention

N, DEPTH = 6, 3
# the paper map without the softmax path: the cheapest Gram maps of the standard blocks
PLAIN = "attention=paper,softmax_correction=false,heads=2"
CAUSAL = f"pre-ln:sigma=0.9,alpha=0.6,{PLAIN},causal=true"


def _attentions(layer):
    if isinstance(layer, Attention):
        return [layer]
    return [a for child in layer.children() for a in _attentions(child)]


@pytest.mark.parametrize("name", registry.names())
def test_every_preset_takes_causal(name):
    if name == "dyt":  # DyT's maps hold only between tokens of equal norm, which the mask makes differ
        with pytest.raises(ValueError, match="equal norm") as exc:
            spec.parse("dyt:causal=true")
        assert "\n" not in str(exc.value)
        assert spec.parse("dyt:causal=false") == ("dyt", {})  # the default, the plain block
        return
    got = spec.parse(f"{name}:causal=true")
    assert got == (name, {"causal": True})
    block, plain = spec.build(*got), spec.build(name, {})
    assert is_causal(block) and not is_causal(plain)
    assert _attentions(block) and all(a.causal for a in _attentions(block))
    assert block == masked(plain) and spec.build(name, {"causal": False}) == plain
    # a decoder's preset (gpt2, llama) is causal unless spelled causal=false, which stays said
    default = registry.lookup(name).causal_default
    assert spec.parse(f"{name}:causal=false") == (name, {"causal": False} if default else {})
    assert spec.parse(name) == (name, {"causal": True} if default else {})
    with pytest.raises(ValueError, match="true or false"):
        spec.parse(f"{name}:causal=maybe")


def test_masked_sets_every_attention_and_the_network_follows():
    """masked() reaches every attention (nested, QK-norm too), masked(., False) none; a
    causal block's network is masked without the caller's flag: output token i does not
    depend on the tokens j > i."""
    att = Attention(sigma_a=1.0, heads=1)
    block = layers.Serial(
        (layers.Residual(layers.Serial((layers.Norm("rms"), att)), alpha=0.5), QKNormAttention(heads=1, gain=1.2))
    )
    on = masked(block)
    assert [a.causal for a in _attentions(on)] == [True, True] and is_causal(on)
    assert not is_causal(masked(on, False)) and masked(on, False) == block
    x = jax.random.normal(jax.random.key(0), (3, 8))
    mod = on.module("lazy")
    jac = jax.jacrev(lambda x: mod.apply({}, x, rngs={"lazy": jax.random.key(1)}))(x)
    assert float(jnp.max(jnp.abs(jac[0, :, 1:, :]))) == 0.0 and float(jnp.max(jnp.abs(jac[1, :, 0, :]))) > 0
    jac = jax.jacrev(lambda x: block.module("lazy").apply({}, x, rngs={"lazy": jax.random.key(1)}))(x)
    assert float(jnp.max(jnp.abs(jac[0, :, 1:, :]))) > 0  # the same draw unmasked reads later tokens


def test_exponents_of_a_causal_block_are_its_per_position_results():
    """One road: the spelled causal preset, the built block with causal=True and rates() of
    the masked block give the same numbers, bit for bit (one compiled program); the
    trajectory's last layer is the rates' q_L_pos and rho_L_pos."""
    got = phasefield.exponents(CAUSAL, n_tokens=N, depth=DEPTH)
    plain = spec.build("pre-ln", spec.parse(CAUSAL.replace(",causal=true", ""))[1])
    want = layers.causal_rates(plain, N, DEPTH, causal=True)
    assert set(got) == {"q_L_pos", "rho_L_pos", "angle_rate_last", "lambda_g_last"}
    for k, v in want.items():
        assert np.array_equal(np.asarray(got[k]), np.asarray(v)), k
    assert np.all(np.isfinite(np.asarray(got["q_L_pos"])))
    assert np.ptp(np.asarray(got["q_L_pos"])) > 1e-3  # the mask makes the positions differ
    traj = layers.trajectory(masked(plain), q0=1.0, rho0=0.5, n_tokens=N, depth=DEPTH)
    assert np.asarray(traj["q_pos"]).shape == (DEPTH + 1, N)
    np.testing.assert_allclose(traj["q_pos"][-1], got["q_L_pos"], rtol=0, atol=1e-13)
    np.testing.assert_allclose(traj["rho_pos"][-1], got["rho_L_pos"], rtol=0, atol=1e-13)
    assert np.all(np.asarray(traj["q_pos"][0]) == 1.0) and float(traj["rho_pos"][0, 1]) == 0.5
    for fn in (layers.fixed_point_exponents, layers.finite_depth):
        with pytest.raises(ValueError, match="per position"):
            fn(masked(plain), n_tokens=N, depth=DEPTH)


def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_point_commands_answer_per_position(capsys):
    size = ("--n-tokens", str(N), "--depth", str(DEPTH))
    rc, out, _ = _run(capsys, "exponents", "--block", CAUSAL, *size, "--json")
    assert rc == 0
    res = json.loads(out)
    want = phasefield.exponents(CAUSAL, n_tokens=N, depth=DEPTH)
    assert res["q_L_pos"] == [float(v) for v in want["q_L_pos"]] and len(res["rho_L_pos"]) == N
    assert res["lambda_g_last"] == float(want["lambda_g_last"]) and res["causal"] is True
    assert "lambda_g_input" not in res and "q_L" not in res
    rc, out, _ = _run(capsys, "exponents", "--block", CAUSAL, *size)
    assert rc == 0 and "angle_rate_last = " in out and len(out.splitlines()) == 5 + N
    rc, out, _ = _run(capsys, "trajectory", "--block", CAUSAL, *size, "--rho0", "0.5", "--json")
    assert rc == 0
    traj = json.loads(out)
    assert np.asarray(traj["q_pos"]).shape == (DEPTH + 1, N) and traj["layer"] == list(range(DEPTH + 1))
    np.testing.assert_allclose(traj["q_pos"][-1], res["q_L_pos"], rtol=0, atol=1e-13)


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["exponents", "--block", "dyt:causal=true"], "equal norm"),
        (["trajectory", "--block", "dyt:causal=true"], "equal norm"),
        (["exponents", "--block", "pre-ln:causal=2"], "true or false"),
        (["simulate", "sweep", "--block", CAUSAL, "--axis", "n_tokens=4,8", "-o", "OUT"], "one n_tokens"),
        # a causal sweep: the (q, p) rates' simulation rows, the paper's closed-form flags,
        # a chunk beyond memory (checked before any work)
        (
            ["sweep", "--block", CAUSAL, "--axis", "depth=2,3", "--axis", "n_tokens=4,6"]
            + ["--out", "OUT", "--figure", "FIG", "--sim", "ROWS"],
            "(q, p) rates",
        ),
        (["sweep", "--block", "paper:causal=true", "--sigma-w", "1,2", "--out", "OUT"], "options of the paper block"),
        (
            ["sweep", "--block", "pre-ln:causal=true", "--axis", "sigma=0.5,1", "--n-tokens", "100000", "--out", "OUT"],
            "memory",
        ),
        (
            ["figures", "--block", "pre-ln:causal=true", "--axis", "sigma=0.5,1", "--axis", "alpha=0.5,1"]
            + ["--n-tokens", "100000", "--out", "OUT"],
            "memory",
        ),
    ],
)
def test_bad_causal_input_is_one_line(capsys, tmp_path, argv, msg):
    paths = {"OUT": tmp_path / "out.nc", "FIG": tmp_path / "f.png", "ROWS": tmp_path / "rows.jsonl"}
    argv = [str(paths[a]) if a in paths else a for a in argv]
    rc, _, err = _run(capsys, *argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())


# a causal sweep's grid: CAUSAL's numbers as axes (the same compiled point as the tests above)
GRID_SPEC = CAUSAL.replace("sigma=0.9,alpha=0.6,", "")
AXES = {"sigma": [0.6, 0.9], "alpha": [0.3, 0.6]}


def _against_points(ds, sigmas, alphas):
    """Each point of a causal sweep (its grid dimensions, and ``position`` for the values per
    position) against layers.causal_rates at that point (one point, its own program), finite."""
    name, kw = spec.parse(GRID_SPEC)
    assert ds["q_L_pos"].dims == ("sigma", "alpha", "position") and ds["lambda_g_last"].dims == ("sigma", "alpha")
    assert ds["position"].values.tolist() == list(range(N)) and "lambda_g_input" not in ds
    for i, sg in enumerate(sigmas):
        for j, al in enumerate(alphas):
            want = layers.causal_rates(spec.build(name, dict(kw, sigma=sg, alpha=al)), N, DEPTH)
            for k, v in want.items():
                got = ds[k].isel(sigma=i, alpha=j).values
                assert np.all(np.isfinite(got)), k
                np.testing.assert_allclose(got, np.asarray(v), rtol=0, atol=1e-13, err_msg=k)
    assert np.ptp(ds["q_L_pos"].values[0, 0]) > 1e-3  # the mask makes the positions differ


def test_a_causal_sweep_is_chunked_sharded_resumed_and_per_position(tmp_path, monkeypatch):
    """A causal block's grid through the one driver: chunks of 2 points split over (up to)
    two devices, an interruption after the first chunk keeps it, the rerun computes only the
    other, and every point is layers.causal_rates's."""
    from phasefield.layers import sweep as layers_sweep

    out = tmp_path / "c.nc"
    run = dict(block=GRID_SPEC, axes=AXES, n_tokens=N, depth=DEPTH, chunk_size=2, out=str(out))
    run["devices"] = jax.local_devices()[:2]
    real, calls = layers_sweep.evaluate_chunk, []

    def evaluate(plan, values, depth):
        calls.append(len(calls))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(plan, values, depth)

    monkeypatch.setattr(layers_sweep, "evaluate_chunk", evaluate)
    with pytest.raises(KeyboardInterrupt):
        phasefield.sweep(**run)
    assert not out.exists() and len(list((tmp_path / "c.nc.chunks").glob("chunk_*.npz"))) == 1
    calls.clear()
    ds = phasefield.sweep(**run)
    assert len(calls) == 1 and out.exists() and not (tmp_path / "c.nc.chunks").exists()
    _against_points(ds, AXES["sigma"], AXES["alpha"])


def test_sweep_and_figures_draw_a_causal_blocks_last_token(capsys, tmp_path):
    """`sweep --block NAME:causal=true --figure` and `figures --block NAME:causal=true`: the
    same grid, each point causal_rates's, the diagram drawn from the last token's rates."""
    grid = ("--axis", "sigma=0.9", "--axis", "alpha=0.3,0.6", "--n-tokens", str(N), "--depth", str(DEPTH))
    nc, png = tmp_path / "s.nc", tmp_path / "s.png"
    rc, _, err = _run(capsys, "sweep", "--block", GRID_SPEC, *grid, "--out", str(nc), "--figure", str(png), "--quiet")
    assert rc == 0, err
    rc, _, err = _run(capsys, "figures", "--block", GRID_SPEC, *grid, "--out", str(tmp_path / "figs"))
    assert rc == 0, err
    from phasefield import io

    ds, fig = io.read_netcdf(nc), io.read_netcdf(tmp_path / "figs" / "phase_pre-ln.nc")
    _against_points(ds, [0.9], AXES["alpha"])
    for k in ds.data_vars:
        assert np.array_equal(fig[k].values, ds[k].values), k
    assert png.stat().st_size > 1000 and (tmp_path / "figs" / "phase_pre-ln.png").stat().st_size > 1000
