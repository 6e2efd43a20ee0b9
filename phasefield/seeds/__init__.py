"""The other seed theories (docs/theory.md §9; docs/seeds.md).

* :mod:`.rank_collapse` — Noci et al. 2022: query/key/value gradient norms, Eq. 8 (corrected),
  forward recursions and the softmax temperature, with autodiff checks.
* :mod:`.deepscalelm` — Kedia et al. 2024: moment propagation through components, blocks and
  pre-/post-LN stacks, the DeepScaleLM init and scaling, and a finite-width simulator.
* :mod:`.sensitivity` — Catformer appendix: the sensitivity estimator, depth profiles and
  their closed forms, and the sensitivity of the seed-001 block.
* :mod:`.figures` — one figure per module.

Modules are imported lazily (``from phasefield.seeds import rank_collapse``).
"""
