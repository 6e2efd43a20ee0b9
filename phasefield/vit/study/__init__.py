"""The trainability study: does the initialization predict the trained loss?

The library side of ``scripts/trainability_study.py`` (a thin command line over it): the
studies the shipped loss predictors (``phasefield/vit/trainability_model*.json``) were fitted
on and scored by, and the procedures that fit, score and ship them.

registry       the studies (designs, training configs, result directories), plans, Sobol
               configurations; :data:`registry.POOLED`, the paper block's training data
training       a study's projected cost and its resumable training
feature_cache  the theory features of every trained configuration (features.csv)
pooled         the pooled studies' runs and configuration table
loss           the paper block's loss predictor: cross-validated analysis, held-out score,
               figures, shipped model
lr_axis        the learning-rate axis (the ``lr`` study)
failure_model  P(fails to train): grouped CV on the pooled studies, shipped, scored on unseen runs
scoring        a shipped model on a study's runs it never saw
heldout        a pair of held-out sets pooled, with bootstrap intervals
blocks         the standard blocks' (pre-LN, post-LN) predictors
provenance     the ``provenance`` object every shipped model file carries

Importing this package imports no JAX; the modules import what they use when called. The
result tables are read from and written to the source tree (``docs/data/trainability``);
functions that report progress take ``log``, a print-like callable (default ``print``).
"""
