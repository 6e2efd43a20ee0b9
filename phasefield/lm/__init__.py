"""A causal character-level language model built from phasefield's blocks, and its trainer.

    from phasefield.lm import data, train
    corpus = data.load()                       # the Python standard library's own sources, bytes
    cfg = train.LMConfig(block="pre-ln", width=128, depth=32, steps=300)
    run = train.make_train(cfg, corpus)        # pure: run(rng) -> metrics (jit, vmap over seeds)
    train.summary(cfg, corpus, jax.jit(run)(jax.random.PRNGKey(0)))   # bits per character

:mod:`.data` holds the corpus and its batches, :mod:`.model` the network, :mod:`.train` the
configuration, the training function and the per-run summary (docs/lm.md).
"""
