"""The per-scale (S, T) mesh tables of the block sweeps (exact_table.st_mesh_fn: three matrix
products per rho, the shared-logit lattice, the z-rule and the pair moments' a-grid each sized
per mesh point from static levels) against the reference moments (exact.st_values: six pair
tables on the full grid, one rule for every rho), point by point."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phasefield.theory.attention import exact, exact_table


def test_levels_end_with_the_full_sizes():
    n_a, n_z = exact.sizes(sigma_max=4.0, n_max=16.0)
    grids = exact_table.grid_levels(n_a, n_z, 16)
    assert grids[-1] == (n_a, exact_table.lattice_levels(n_a, n_z), exact_table.z_levels(n_z))
    assert exact_table.lattice_levels(n_a, n_z)[-1] == exact.lattice_nodes(n_a, n_z)[0]
    assert exact_table.z_levels(n_z)[-1] == n_z
    sizes = [m for m, _, _ in grids]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    for _m, lv, zs in grids:
        assert list(lv) == sorted(lv) and list(zs) == sorted(zs) and all(z % 2 for z in zs)


@pytest.mark.parametrize("sigma_a", [0.15, 1.9])
def test_mesh_tables_equal_the_reference_moments(sigma_a):
    """sigma_A = 0.15: sigma_c < SIGMA_C_LATTICE everywhere (the Gauss-Hermite rule);
    1.9: the lattice at most points, both signs of rho (the mesh starts at -1/(n-1)). Three
    matrix products and the per-point sizes change the sums by rounding and quadrature error
    (measured <= 2e-14 relative); 1e-13 here."""
    n, m = 8.0, 33
    n_a, n_z = exact.sizes(sigma_max=2.0, n_max=n)
    rho = exact_table._mesh_points(n, m)
    with jax.enable_x64(True):
        s, t = exact_table.st_mesh_fn(n_a, n_z, 8)(
            jnp.asarray(sigma_a), jnp.asarray(n), jnp.asarray(rho), jnp.asarray(m + 1)
        )
        ref = jax.jit(jax.vmap(lambda r: exact.st_values(sigma_a, n, r, n_a, n_z)))
        (s1, sr), (t1, tr) = ref(jnp.asarray(rho[: m + 1]))
    s, t = np.asarray(s), np.asarray(t)
    assert np.all(np.isnan(s[:, m + 1 :])) and np.all(np.isnan(t[:, m + 1 :]))  # after count: NaN
    np.testing.assert_allclose(s[0, : m + 1], s1, rtol=1e-13, atol=0)
    np.testing.assert_allclose(s[1, : m + 1], sr, rtol=1e-13, atol=0)
    np.testing.assert_allclose(t[0, : m + 1], t1, rtol=0, atol=1e-13)
    np.testing.assert_allclose(t[1, : m + 1], tr, rtol=0, atol=1e-13)
